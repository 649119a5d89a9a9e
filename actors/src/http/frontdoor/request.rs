//! The parts of an OpenAI request the front door reads: the model, the prompt (chat
//! `messages` and `tools`, or a completion `prompt`), `stream` and `stream_options`. The body
//! itself is forwarded untouched (but for the audit's `include_usage`); this only decides what to
//! tokenize and whether the answer carries usage.

use serde_json::Value;

use super::FrontError;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

impl ApiKind {
    /// The request path, forwarded unchanged.
    pub fn path(self) -> &'static str {
        match self {
            ApiKind::Chat => "/v1/chat/completions",
            ApiKind::Completion => "/v1/completions",
        }
    }
}

/// What to tokenize.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A chat: rendered with the template, then encoded without added special tokens.
    Chat {
        /// `messages`, as sent.
        messages: Value,
        /// `tools`, if any.
        tools: Option<Value>,
        /// `add_generation_prompt` (vLLM's extension; default true).
        add_generation_prompt: bool,
    },
    /// A completion prompt string, encoded with special tokens.
    Text(String),
    /// A completion prompt given as token ids.
    Tokens(Vec<u32>),
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiRequest {
    /// `model`.
    pub model: String,
    /// What to tokenize.
    pub prompt: Prompt,
    /// `stream`.
    pub stream: bool,
    /// `cache_salt` (vLLM's extension): blocks are shared only with requests of the same salt.
    pub cache_salt: String,
    /// `stream_options.include_usage`: the client wants the final usage chunk.
    pub include_usage: bool,
    /// Whether the body has a `stream_options` key at all.
    pub has_stream_options: bool,
}

/// Parses `body` for `kind`; every problem names the field and what is expected.
pub fn parse(kind: ApiKind, body: &[u8]) -> Result<OpenAiRequest, FrontError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| FrontError::invalid(format!("the body is not valid JSON: {e}"), None))?;
    let Value::Object(map) = &v else {
        return Err(FrontError::invalid("the body must be a JSON object".into(), None));
    };
    let model = match map.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(missing("model", "a non-empty string naming the model (GET /v1/models)")),
    };
    let stream = match map.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(wrong("stream", "a boolean", other)),
    };
    let cache_salt = match map.get("cache_salt") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(wrong("cache_salt", "a string", other)),
    };
    let prompt = match kind {
        ApiKind::Chat => chat_prompt(map)?,
        ApiKind::Completion => completion_prompt(map.get("prompt"))?,
    };
    let options = map.get("stream_options");
    let include_usage = options.and_then(|o| o.get("include_usage")) == Some(&Value::Bool(true));
    let has_stream_options = options.is_some();
    Ok(OpenAiRequest { model, prompt, stream, cache_salt, include_usage, has_stream_options })
}

fn chat_prompt(map: &serde_json::Map<String, Value>) -> Result<Prompt, FrontError> {
    let messages = match map.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => Value::Array(list.clone()),
        Some(Value::Array(_)) => return Err(missing("messages", "at least one message")),
        Some(other) => return Err(wrong("messages", "an array of messages", other)),
        None => return Err(missing("messages", "an array of {role, content} messages")),
    };
    for (i, m) in messages.as_array().into_iter().flatten().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            let field = format!("messages[{i}].role");
            return Err(FrontError::invalid(format!("{field} must be a string"), Some(field)));
        }
    }
    let tools = map.get("tools").filter(|t| !t.is_null()).cloned();
    let add_generation_prompt = match map.get("add_generation_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(wrong("add_generation_prompt", "a boolean", other)),
    };
    Ok(Prompt::Chat { messages, tools, add_generation_prompt })
}

fn completion_prompt(prompt: Option<&Value>) -> Result<Prompt, FrontError> {
    const EXPECTED: &str = "a string, or an array of token ids";
    match prompt {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Ok(Prompt::Text(items[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .map(Prompt::Tokens)
            .ok_or_else(|| {
                FrontError::invalid(
                    format!(
                        "`prompt` must be {EXPECTED}; several prompts in one request are not \
                         supported by the front door: send one request per prompt"
                    ),
                    Some("prompt".into()),
                )
            }),
        Some(other) => Err(wrong("prompt", EXPECTED, other)),
        None => Err(missing("prompt", EXPECTED)),
    }
}

fn missing(field: &str, expected: &str) -> FrontError {
    FrontError::invalid(format!("`{field}` is required: {expected}"), Some(field.into()))
}

fn wrong(field: &str, expected: &str, got: &Value) -> FrontError {
    let got = got.to_string();
    let shown: String = got.chars().take(60).collect();
    FrontError::invalid(format!("`{field}` must be {expected}, not {shown}"), Some(field.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_and_completion_bodies_give_their_prompts() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let r = parse(ApiKind::Chat, chat).unwrap();
        assert!(r.stream);
        assert!(matches!(r.prompt, Prompt::Chat { add_generation_prompt: true, tools: None, .. }));
        let text = parse(ApiKind::Completion, br#"{"model":"m","prompt":"once upon"}"#).unwrap();
        assert_eq!(text.prompt, Prompt::Text("once upon".into()));
        let ids = parse(ApiKind::Completion, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.prompt, Prompt::Tokens(vec![1, 2, 3]));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let cases: [(ApiKind, &[u8], &str); 7] = [
            (ApiKind::Chat, b"{not json", "not valid JSON"),
            (ApiKind::Chat, br#"{"messages":[]}"#, "`model` is required"),
            (ApiKind::Chat, br#"{"model":"m"}"#, "`messages` is required"),
            (ApiKind::Chat, br#"{"model":"m","messages":"hi"}"#, "`messages` must be an array"),
            (ApiKind::Chat, br#"{"model":"m","messages":[{"content":"x"}]}"#, "messages[0].role"),
            (ApiKind::Completion, br#"{"model":"m","prompt":["a","b"]}"#, "one request per"),
            (ApiKind::Completion, br#"{"model":"m","prompt":[1],"stream":1}"#, "`stream` must"),
        ];
        for (kind, body, needle) in cases {
            let e = parse(kind, body).unwrap_err();
            assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
        }
    }
}
