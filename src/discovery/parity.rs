//! The parity check of a listed engine against kvdir's own tokenizer and config, run when the
//! engine's process becomes known.
//!
//! A router that tokenizes a prompt differently from its engine (another chat template, a
//! tokenizer of another revision) computes other content keys, and every request then gets no
//! credit, silently. So kvdir renders a fixed chat ([`parity_chat`]) with its own template and
//! tokenizer and compares the ids with the engine's own (`POST /tokenize`, which vLLM and SGLang
//! both serve); it also compares the engine's block size (vLLM's `vllm:cache_config_info`,
//! SGLang's `/server_info` `page_size`) and served models (`/v1/models`) with its config. The
//! service fetches; this module decides.

use serde::Serialize;
use serde_json::{json, Value};

use crate::prometheus::Samples;

/// The chat rendered on both sides: a system prompt and a user turn with accents, digits,
/// punctuation and an emoji, where tokenizers and templates tend to differ.
pub fn parity_chat() -> Value {
    json!([
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "Héllo, wörld! Is 1234 + 56.7 = 1290.7? Ünïcode 🙂 — \"quotes\" & <tags>."}
    ])
}

/// How the two tokenizations compare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum TokenParity {
    /// The same ids.
    Match {
        /// How many.
        tokens: usize,
    },
    /// The ids differ from `position` on (the first differing index; an id absent on one side
    /// where the other is longer is `null`).
    Differ {
        /// The first differing position.
        position: usize,
        /// kvdir's id there.
        kvdir: Option<u32>,
        /// The engine's id there.
        engine: Option<u32>,
        /// kvdir's count.
        kvdir_tokens: usize,
        /// The engine's count.
        engine_tokens: usize,
    },
    /// Not compared (the engine did not answer `/tokenize`, kvdir has no chat template).
    Unchecked {
        /// Why.
        reason: String,
    },
}

/// One setting compared with the engine's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingParity {
    /// kvdir's config.
    pub configured: String,
    /// What the engine says; `None` when it does not say.
    pub engine: Option<String>,
    /// Whether they agree (true when the engine does not say).
    pub ok: bool,
}

/// The whole check, as `/v1/internal/instances` shows it under `engine.parity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parity {
    /// The chat's token ids.
    pub tokens: TokenParity,
    /// The block size.
    pub block_size: SettingParity,
    /// The model name among the engine's served models.
    pub model: SettingParity,
}

impl Parity {
    /// What disagrees, one sentence each naming the values and the fix; empty when all agree.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let TokenParity::Differ { position, kvdir, engine, kvdir_tokens, engine_tokens } =
            &self.tokens
        {
            let id = |t: &Option<u32>| t.map_or("none".to_string(), |t| format!("id {t}"));
            let (kvdir, engine) = (id(kvdir), id(engine));
            out.push(format!(
                "kvdir and the engine tokenize the same chat differently from position {position} \
                 (kvdir {kvdir} of {kvdir_tokens} ids, engine {engine} of {engine_tokens}): \
                 no prompt will get cache credit; give --tokenizer_path (and --chat_template) the \
                 engine's own tokenizer and template"
            ));
        }
        if !self.block_size.ok {
            out.push(format!(
                "the engine's block size is {} but kvdir's config says {}: set block_size to the \
                 engine's",
                self.block_size.engine.as_deref().unwrap_or("?"),
                self.block_size.configured
            ));
        }
        if !self.model.ok {
            out.push(format!(
                "the engine serves {} but kvdir's config names model {:?}: set model to one it \
                 serves",
                self.model.engine.as_deref().unwrap_or("?"),
                self.model.configured
            ));
        }
        out
    }
}

/// Compares kvdir's ids with the engine's.
pub fn compare_tokens(kvdir: &[u32], engine: &[u32]) -> TokenParity {
    let position = kvdir.iter().zip(engine).position(|(a, b)| a != b);
    let position = match position {
        Some(p) => p,
        None if kvdir.len() == engine.len() => return TokenParity::Match { tokens: kvdir.len() },
        None => kvdir.len().min(engine.len()),
    };
    TokenParity::Differ {
        position,
        kvdir: kvdir.get(position).copied(),
        engine: engine.get(position).copied(),
        kvdir_tokens: kvdir.len(),
        engine_tokens: engine.len(),
    }
}

/// The ids of an engine's `/tokenize` answer (`{"tokens": [...]}`, vLLM and SGLang).
pub fn engine_tokens(body: &str) -> Result<Vec<u32>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let tokens = v.get("tokens").and_then(Value::as_array).ok_or("no \"tokens\" array")?;
    tokens
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or("a token id is no u32"))
        .map(|r| r.map_err(String::from))
        .collect()
}

/// vLLM's block size from its `/metrics` (`vllm:cache_config_info{block_size="16",...} 1`).
pub fn vllm_block_size(metrics: &str) -> Option<u32> {
    let s = Samples::parse(metrics);
    let info = s.samples.iter().find(|x| x.name == "vllm:cache_config_info")?;
    info.label("block_size")?.parse().ok()
}

/// SGLang's page size from its `/server_info`.
pub fn sglang_page_size(server_info: &str) -> Option<u32> {
    let v: Value = serde_json::from_str(server_info).ok()?;
    v.get("page_size")?.as_u64().and_then(|p| u32::try_from(p).ok())
}

/// The model ids of an OpenAI `/v1/models` answer.
pub fn served_models(body: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    let data = v.get("data").and_then(Value::as_array).cloned().unwrap_or_default();
    data.iter().filter_map(|m| m.get("id")?.as_str().map(String::from)).collect()
}

/// A setting compared: `engine` is what the engine says, if anything.
pub fn setting(configured: impl ToString, engine: Option<String>, ok: bool) -> SettingParity {
    SettingParity { configured: configured.to_string(), engine, ok }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_differing_position_is_named() {
        assert_eq!(compare_tokens(&[1, 2, 3], &[1, 2, 3]), TokenParity::Match { tokens: 3 });
        let d = compare_tokens(&[1, 2, 3], &[1, 9, 3]);
        assert!(matches!(
            d,
            TokenParity::Differ { position: 1, kvdir: Some(2), engine: Some(9), .. }
        ));
        let longer = compare_tokens(&[1, 2], &[1, 2, 5]);
        assert!(matches!(
            longer,
            TokenParity::Differ { position: 2, kvdir: None, engine: Some(5), .. }
        ));
        let p = Parity {
            tokens: d,
            block_size: setting(16, Some("32".into()), false),
            model: setting("m", None, true),
        };
        let problems = p.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("position 1") && problems[0].contains("--tokenizer_path"));
        assert!(problems[1].contains("block size is 32") && problems[1].contains("says 16"));
    }

    #[test]
    fn engine_answers_are_read() {
        assert_eq!(engine_tokens(r#"{"tokens":[5,6],"count":2}"#), Ok(vec![5, 6]));
        assert!(engine_tokens(r#"{"count":2}"#).unwrap_err().contains("tokens"));
        let m = "vllm:cache_config_info{block_size=\"32\",cache_dtype=\"auto\"} 1.0\n";
        assert_eq!(vllm_block_size(m), Some(32));
        assert_eq!(vllm_block_size("x 1\n"), None);
        assert_eq!(sglang_page_size(r#"{"page_size": 16, "x": 1}"#), Some(16));
        let models = r#"{"object":"list","data":[{"id":"model"},{"id":"lora-a"}]}"#;
        assert_eq!(served_models(models), ["model", "lora-a"]);
    }
}
