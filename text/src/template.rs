//! Chat templates: the Jinja source from `tokenizer_config.json` (or a file), rendered with
//! `minijinja` plus `minijinja-contrib`'s Python-compat methods (`.strip()`, `.items()`, ...),
//! with the variables the engines' Python code passes: `messages`, `tools`,
//! `add_generation_prompt` and the special tokens (`bos_token`, `eos_token`, `unk_token`,
//! `pad_token`), and a `raise_exception` function.

use minijinja::{Environment, ErrorKind, Value as JValue};
use serde_json::Value;

use crate::TextError;

/// Special tokens a template may use, as the config names them.
const SPECIAL_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: Vec<(&'static str, String)>,
}

impl ChatTemplate {
    /// The template from `override_source`, else the config's `chat_template` (a string, or a
    /// list of `{name, template}` from which `default` is used); `None` when there is none.
    pub fn from_config(
        config: Option<&Value>,
        override_source: Option<String>,
    ) -> Result<Option<ChatTemplate>, TextError> {
        let source = override_source.or_else(|| config.and_then(config_template));
        let Some(source) = source else { return Ok(None) };
        let specials = SPECIAL_TOKENS
            .iter()
            .filter_map(|&k| Some((k, special_token(config?.get(k)?)?)))
            .collect();
        ChatTemplate::new(source, specials).map(Some)
    }

    /// Compiles `source`.
    pub fn new(source: String, specials: Vec<(&'static str, String)>) -> Result<Self, TextError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<JValue, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source).map_err(|e| TextError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, specials })
    }

    /// Renders `messages`.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template =
            self.env.get_template("chat").map_err(|e| TextError::Template(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), text_messages(messages)?);
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        for (k, v) in &self.specials {
            ctx.insert((*k).into(), Value::String(v.clone()));
        }
        template.render(JValue::from_serialize(&ctx)).map_err(|e| TextError::Template(describe(&e)))
    }
}

/// The message of a render error with its cause chain (minijinja nests them).
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn config_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// A special token is a string or an `AddedToken` object with `content`.
fn special_token(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `messages` with OpenAI content-part lists (`[{"type": "text", "text": ...}, ...]`) joined
/// into one string with newlines, as vLLM does for string-content templates. Other part types
/// (images, audio) are refused: multimodal prompts are out of kvdir's scope.
fn text_messages(messages: &Value) -> Result<Value, TextError> {
    let Value::Array(list) = messages else {
        return Err(TextError::Template("`messages` must be an array of messages".into()));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let mut m = m.clone();
        if let Some(Value::Array(parts)) = m.get("content") {
            let mut texts = Vec::with_capacity(parts.len());
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str))
                {
                    (Some("text"), Some(t)) => texts.push(t),
                    (kind, _) => {
                        return Err(TextError::Template(format!(
                            "messages[{i}]: content part of type {kind:?} is not supported; \
                             kvdir routes text prompts only"
                        )))
                    }
                }
            }
            m["content"] = Value::String(texts.join("\n"));
        }
        out.push(m);
    }
    Ok(Value::Array(out))
}
