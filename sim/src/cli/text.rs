//! The `kvdir-sim` flags of the OpenAI engine: which tokenizer and chat template to serve,
//! under which name, and the simulated prefill and decode costs. One model is loaded for all
//! engines.

use std::path::Path;
use std::sync::Arc;

use kvdir_text::TextModel;

use crate::{CachedReport, OpenAiConfig};
use kvdir::config::args::number;

/// Flags of the OpenAI engine; without `tokenizer_path` the engines serve no text model.
#[derive(Debug, Clone, PartialEq)]
pub struct TextOptions {
    /// `--tokenizer_path`: a model directory (`tokenizer.json`, `tokenizer_config.json`) or a
    /// `tokenizer.json` file.
    pub tokenizer_path: Option<String>,
    /// `--chat_template`: a Jinja file overriding the model's chat template.
    pub chat_template: Option<String>,
    /// `--served_model_name`; defaults to `tokenizer_path` as given (as vLLM names a model by
    /// its path).
    pub served_model_name: Option<String>,
    /// `--prefill_us_per_token`.
    pub prefill_us_per_token: u64,
    /// `--decode_us_per_token`.
    pub decode_us_per_token: u64,
    /// `--max_tokens`: output tokens of a request that gives none.
    pub max_tokens: u32,
    /// `--report_cached_tokens`: the truth, or a misreport.
    pub cached_report: CachedReport,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            tokenizer_path: None,
            chat_template: None,
            served_model_name: None,
            prefill_us_per_token: 20,
            decode_us_per_token: 1000,
            max_tokens: 16,
            cached_report: CachedReport::Actual,
        }
    }
}

impl TextOptions {
    /// Sets flag `--name`; `Ok(false)` when it is not one of these flags.
    pub(crate) fn set(&mut self, name: &str, value: &str) -> Result<bool, String> {
        match name {
            "tokenizer_path" => self.tokenizer_path = Some(value.to_string()),
            "chat_template" => self.chat_template = Some(value.to_string()),
            "served_model_name" => self.served_model_name = Some(value.to_string()),
            "prefill_us_per_token" => self.prefill_us_per_token = number(name, value)?,
            "decode_us_per_token" => self.decode_us_per_token = number(name, value)?,
            "max_tokens" => self.max_tokens = number(name, value)?,
            "report_cached_tokens" => self.cached_report = value.parse()?,
            "write_demo_model" => {
                return Err("--write_demo_model DIR is used alone: it writes the model and exits"
                    .to_string())
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Problems of these flags for engines with business HTTP port `http_port`.
    pub(crate) fn problems(&self, http_port: u16) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(path) = &self.tokenizer_path else {
            if self.chat_template.is_some() || self.served_model_name.is_some() {
                problems.push(
                    "--chat_template and --served_model_name need --tokenizer_path".to_string(),
                );
            }
            return problems;
        };
        if http_port == 0 {
            problems.push(format!(
                "--tokenizer_path {path} needs --http_port: the OpenAI endpoints are served \
                 on the engines' HTTP ports"
            ));
        }
        if self.served_model_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            problems.push("--served_model_name is empty; name the model".to_string());
        }
        problems
    }

    /// Loads the model and builds the engines' OpenAI config; `None` without a tokenizer.
    pub(crate) fn openai_config(&self) -> Result<Option<OpenAiConfig>, String> {
        let Some(path) = &self.tokenizer_path else { return Ok(None) };
        let template = self.chat_template.as_deref().map(Path::new);
        let model = TextModel::load(Path::new(path), template)
            .map_err(|e| format!("--tokenizer_path {path}: {e}"))?;
        let name = self.served_model_name.as_deref().unwrap_or(path);
        let config = OpenAiConfig {
            prefill_us_per_token: self.prefill_us_per_token,
            decode_us_per_token: self.decode_us_per_token,
            max_tokens: self.max_tokens,
            cached_report: self.cached_report,
            ..OpenAiConfig::new(Arc::new(model), name)
        };
        match config.problems().as_slice() {
            [] => Ok(Some(config)),
            problems => Err(problems.join("; ").replace("openai.", "--")),
        }
    }
}
