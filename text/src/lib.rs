//! kvdir's text side: turns an OpenAI-style request into the token ids an engine computes
//! for it, so that the directory's prefix lookups see what the engine cached.
//!
//! - [`TextModel::load`] reads a Hugging Face `tokenizer.json` (with the `tokenizers` crate,
//!   no hub access) and the chat template plus special tokens from `tokenizer_config.json`,
//!   or from a template file given explicitly.
//! - [`TextModel::chat_prompt`] renders the template with `minijinja` and its Python-compat
//!   methods, passing `messages`, `tools`, `add_generation_prompt` and the special tokens, as
//!   vLLM's and xLLM's Python front ends do.
//! - Chat prompts are encoded without adding special tokens (the template writes them);
//!   plain completion prompts with them, again as the engines do. Long pieces between added
//!   tokens (a shared system prompt) are encoded once and remembered ([`SegmentCache`]).
//! - [`demo`] trains a small byte-level BPE and writes a ChatML model directory, for the demo
//!   and the tests (no model can be downloaded here).
//!
//! Everything here is synchronous and CPU-bound: callers on an async runtime run it on a
//! blocking pool.

pub mod demo;
mod segments;
mod template;

use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;
use tokenizers::Tokenizer;

pub use segments::SegmentCache;
pub use template::ChatTemplate;

/// Everything that can go wrong loading a model's text files or applying them.
#[derive(Debug, Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `tokenizer.json` did not load.
    #[error("{path} is not a Hugging Face tokenizer.json: {reason}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizers crate's message.
        reason: String,
    },
    /// `tokenizer_config.json` is not valid JSON.
    #[error("{path} is not valid JSON: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The model has no chat template and none was given.
    #[error(
        "no chat template: {0} has no `chat_template`; pass --chat_template FILE, or use \
         /v1/completions"
    )]
    NoTemplate(String),
    /// The template did not compile or failed while rendering (including `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// Encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Encode(String),
}

/// A model's tokenizer and chat template.
pub struct TextModel {
    tokenizer: Tokenizer,
    segments: Option<SegmentCache>,
    template: Option<ChatTemplate>,
    source: PathBuf,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel").field("source", &self.source).finish_non_exhaustive()
    }
}

impl TextModel {
    /// Loads `path`: a directory holding `tokenizer.json` (and usually
    /// `tokenizer_config.json`), or a `tokenizer.json` file whose directory may hold the
    /// config. `template` overrides the config's `chat_template` with a Jinja file.
    pub fn load(path: &Path, template: Option<&Path>) -> Result<TextModel, TextError> {
        let (tokenizer_file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            (path.to_path_buf(), path.parent().map(Path::to_path_buf).unwrap_or_default())
        };
        let tokenizer =
            Tokenizer::from_file(&tokenizer_file).map_err(|e| {
                match std::fs::metadata(&tokenizer_file) {
                    Err(source) => TextError::Read { path: tokenizer_file.clone(), source },
                    Ok(_) => {
                        TextError::Tokenizer { path: tokenizer_file.clone(), reason: e.to_string() }
                    }
                }
            })?;
        let config_file = dir.join("tokenizer_config.json");
        let config = if config_file.is_file() {
            let text = read(&config_file)?;
            let value: Value = serde_json::from_str(&text).map_err(|e| TextError::Config {
                path: config_file.clone(),
                reason: e.to_string(),
            })?;
            Some(value)
        } else {
            None
        };
        let override_text = template.map(read).transpose()?;
        let template = ChatTemplate::from_config(config.as_ref(), override_text)?;
        let segments = SegmentCache::new(&tokenizer);
        Ok(TextModel { tokenizer, segments, template, source: tokenizer_file })
    }

    /// The `tokenizer.json` this model was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders a chat request's `messages` (and `tools`, if any) into the prompt text.
    pub fn chat_prompt(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| TextError::NoTemplate(self.source.display().to_string()))?;
        template.render(messages, tools, add_generation_prompt)
    }

    /// Token ids of `text`; `add_special_tokens` as the `tokenizers` post-processor defines it
    /// (false for rendered chat prompts, true for plain completion prompts).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        if let (false, Some(cache)) = (add_special_tokens, &self.segments) {
            return cache
                .encode(&self.tokenizer, text)
                .map_err(|e| TextError::Encode(e.to_string()));
        }
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TextError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer.decode(ids, true).map_err(|e| TextError::Encode(e.to_string()))
    }

    /// The id of a token in the vocabulary (added tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Whether long pieces between added tokens are remembered ([`SegmentCache`]).
    pub fn caches_segments(&self) -> bool {
        self.segments.is_some()
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

fn read(path: &Path) -> Result<String, TextError> {
    std::fs::read_to_string(path).map_err(|source| TextError::Read { path: path.into(), source })
}
