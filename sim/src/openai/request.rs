//! Parsing OpenAI request bodies into the prompt tokens an engine computes and the generation
//! parameters, with every bad value named (see [`ApiError`]).

use kvdir::config::json_type_name;
use serde_json::{Map, Value};

use super::{ApiError, OpenAiConfig, MAX_OUTPUT_TOKENS};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

/// What a request asks to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Params {
    /// Output tokens to produce.
    pub(crate) max_tokens: u32,
    /// Answer as server-sent events.
    pub(crate) stream: bool,
    /// With `stream`: send a last chunk holding `usage`.
    pub(crate) include_usage: bool,
}

/// A parsed request: its prompt tokens and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) tokens: Vec<i32>,
    pub(crate) params: Params,
    /// vLLM's `cache_salt` (read only when asked for).
    pub(crate) salt: Option<String>,
}

/// Parses and tokenizes `body` for `kind`, reading `cache_salt` when `salted` (vLLM's field; the
/// xLLM dialect ignores it). CPU-bound: run it off the async workers.
pub(crate) fn parse(
    kind: Kind,
    body: &[u8],
    config: &OpenAiConfig,
    salted: bool,
) -> Result<Parsed, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::BadJson(e.to_string()))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::BadJson(format!("got {}", json_type_name(&value))));
    };
    check_model(&fields, config)?;
    let params = params(kind, &fields, config)?;
    let tokens = match kind {
        Kind::Chat => chat_tokens(&fields, config)?,
        Kind::Completion => completion_tokens(&fields, config)?,
    };
    if tokens.is_empty() {
        let field = if kind == Kind::Chat { "messages" } else { "prompt" };
        return Err(bad(field, "gives an empty prompt (0 tokens); send some text"));
    }
    let salt = if salted { cache_salt(&fields)? } else { None };
    Ok(Parsed { tokens, params, salt })
}

/// `POST /tokenize` (vLLM's and SGLang's): the ids of `messages` rendered as a chat, or of
/// `prompt`, as this engine computes them for a request.
pub(crate) fn tokenize(body: &[u8], config: &OpenAiConfig) -> Result<Vec<i32>, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::BadJson(e.to_string()))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::BadJson(format!("got {}", json_type_name(&value))));
    };
    match field(&fields, "messages") {
        Some(_) => chat_tokens(&fields, config),
        None => completion_tokens(&fields, config),
    }
}

/// `cache_salt`: absent, or a non-empty string (as vLLM requires).
fn cache_salt(fields: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match field(fields, "cache_salt") {
        None => Ok(None),
        Some(Value::String(salt)) if !salt.is_empty() => Ok(Some(salt.clone())),
        Some(other) => Err(bad("cache_salt", format!("= {other} is not a non-empty string"))),
    }
}

fn bad(field: &'static str, problem: impl Into<String>) -> ApiError {
    ApiError::BadField { field, problem: problem.into() }
}

/// A present, non-null field.
fn field<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    fields.get(name).filter(|v| !v.is_null())
}

/// `model` is optional; when given it must be the served name.
fn check_model(fields: &Map<String, Value>, config: &OpenAiConfig) -> Result<(), ApiError> {
    match field(fields, "model") {
        None => Ok(()),
        Some(Value::String(m)) if *m == config.served_model_name => Ok(()),
        Some(Value::String(m)) => Err(ApiError::ModelNotFound {
            asked: m.clone(),
            served: config.served_model_name.clone(),
        }),
        Some(other) => {
            Err(bad("model", format!("is {}; give the model name", json_type_name(other))))
        }
    }
}

fn flag(fields: &Map<String, Value>, name: &'static str, default: bool) -> Result<bool, ApiError> {
    match field(fields, name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(name, format!("is {}; give true or false", json_type_name(other)))),
    }
}

fn params(
    kind: Kind,
    fields: &Map<String, Value>,
    config: &OpenAiConfig,
) -> Result<Params, ApiError> {
    let name = match kind {
        Kind::Chat if field(fields, "max_completion_tokens").is_some() => "max_completion_tokens",
        _ => "max_tokens",
    };
    let max_tokens = match field(fields, name) {
        None => config.max_tokens,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=MAX_OUTPUT_TOKENS).contains(n))
            .ok_or_else(|| {
                bad(name, format!("= {v} is not an integer in 1..={MAX_OUTPUT_TOKENS}"))
            })?,
    };
    let stream = flag(fields, "stream", false)?;
    let include_usage = match field(fields, "stream_options") {
        None => false,
        Some(Value::Object(options)) => flag(options, "include_usage", false)?,
        Some(other) => {
            return Err(bad(
                "stream_options",
                format!("is {}; give an object", json_type_name(other)),
            ))
        }
    };
    Ok(Params { max_tokens, stream, include_usage })
}

/// The chat template rendered over `messages` (and `tools`), encoded without special tokens.
fn chat_tokens(fields: &Map<String, Value>, config: &OpenAiConfig) -> Result<Vec<i32>, ApiError> {
    let messages = match field(fields, "messages") {
        None => return Err(bad("messages", "is missing; a chat request needs a messages array")),
        Some(Value::Array(m)) if m.is_empty() => {
            return Err(bad("messages", "is empty; send at least one message"))
        }
        Some(m @ Value::Array(_)) => m,
        Some(other) => {
            return Err(bad(
                "messages",
                format!("is {}; give an array of messages", json_type_name(other)),
            ))
        }
    };
    let tools = field(fields, "tools");
    let add_generation_prompt = flag(fields, "add_generation_prompt", true)?;
    let model = &config.model;
    let prompt = model
        .chat_prompt(messages, tools, add_generation_prompt)
        .map_err(|e| ApiError::Tokenize(e.to_string()))?;
    let ids = model.encode(&prompt, false).map_err(|e| ApiError::Tokenize(e.to_string()))?;
    Ok(ids_to_tokens(&ids))
}

/// `prompt` as text (encoded with special tokens) or as token ids (taken as given).
fn completion_tokens(
    fields: &Map<String, Value>,
    config: &OpenAiConfig,
) -> Result<Vec<i32>, ApiError> {
    let encode = |text: &str| {
        let ids = config.model.encode(text, true).map_err(|e| ApiError::Tokenize(e.to_string()))?;
        Ok(ids_to_tokens(&ids))
    };
    match field(fields, "prompt") {
        None => Err(bad("prompt", "is missing; a completion request needs a prompt")),
        Some(Value::String(text)) => encode(text),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(text)] => encode(text),
            _ => token_ids(items, config.model.vocab_size()),
        },
        Some(other) => Err(bad(
            "prompt",
            format!("is {}; give a string or an array of token ids", json_type_name(other)),
        )),
    }
}

fn token_ids(items: &[Value], vocab_size: usize) -> Result<Vec<i32>, ApiError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .filter(|id| *id < vocab_size as u64)
                .and_then(|id| i32::try_from(id).ok())
                .ok_or_else(|| {
                    bad(
                        "prompt",
                        format!(
                            "holds {item}, not a token id in 0..{vocab_size}; give one string or \
                             an array of token ids"
                        ),
                    )
                })
        })
        .collect()
}

/// Vocabulary ids as the cache's token type (ids of a real vocabulary fit an `i32`).
fn ids_to_tokens(ids: &[u32]) -> Vec<i32> {
    ids.iter().map(|&id| i32::try_from(id).unwrap_or(i32::MAX)).collect()
}
