//! The engine as an OpenAI-compatible server: with [`OpenAiConfig`] in
//! [`crate::EngineConfig::openai`], the engine's business HTTP port serves
//! `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/completions` next to
//! `GET /health` (see `server`).
//!
//! A request is served the way a prefix-caching engine serves it:
//! 1. tokenize like the engine (`request`): chat = the model's chat template rendered with
//!    `add_generation_prompt` (default true, as in vLLM), encoded without special tokens;
//!    completions = `prompt` text encoded with special tokens, or a token-id array as given;
//! 2. pick the DP rank: in the xLLM dialect (`generate::choose_rank`) the rank holding the
//!    longest cached prefix of the prompt (Device or Host), ties to the rank with fewest
//!    requests in flight, then to the lowest rank; in the vLLM dialect the rank named by the
//!    request's `X-data-parallel-rank` header (400 outside `0..dp_size`, ignored when not an
//!    integer, as vLLM does), else vLLM's own cache-blind balancer (`generate::balance_rank`:
//!    fewest requests in flight, idle ranks in turn). `usage.prompt_tokens_details.cached_tokens` is that rank's cached prefix, in tokens
//!    (whole blocks), at most the whole blocks before the prompt's last token (an engine
//!    computes that token whatever it holds, `kvdir::car::reusable_limit`); the rank is in the
//!    `x-sim-dp-rank` response header;
//! 3. sleep `prefill_us_per_token` per uncached prompt token (async), then process the prompt
//!    into that rank's cache, which publishes its KV events exactly like
//!    [`crate::SimEngine::process`]; with `serial_prefill` a rank prefills one request at a
//!    time, in arrival order (a GPU's prefill throughput is bounded: past it requests queue),
//!    else every request prefills at once;
//! 4. produce `max_tokens` output tokens (a fixed answer text, tokenized by the model),
//!    sleeping `decode_us_per_token` before each; with `stream: true` each token is one SSE
//!    chunk as soon as it exists, and a client that disconnects stops the generation.
//!
//! In the vLLM dialect `cached_tokens` counts only the full cached blocks within the prompt's
//! first n - 1 tokens (vLLM always computes the last prompt token), a request's `cache_salt`
//! keys its blocks apart (the first block's store carries it in `extra_keys`), and `metrics`
//! serves `GET /metrics`.
//!
//! Without a text model the OpenAI routes answer 503. Every error is OpenAI's error JSON
//! (`{"error": {"message", "type", "code"}}`), see [`ApiError`].
//!
//! `RequestLoad` counts requests in flight ([`crate::SimEngine::in_flight`]); a
//! [`crate::Registration`] adds those waiting or prefilling to the `waiting_requests_num` it
//! reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use kvdir_text::TextModel;
use serde_json::json;
use thiserror::Error;

pub(crate) mod generate;
pub(crate) mod metrics;
pub(crate) mod request;
pub(crate) mod server;

/// Largest `max_tokens` a request may ask for.
pub const MAX_OUTPUT_TOKENS: u32 = 65_536;

/// The text side of an engine: its model, its name and its costs.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Tokenizer and chat template, shared by every engine that serves the model.
    pub model: Arc<TextModel>,
    /// The `model` requests must name (when they name one) and `/v1/models` lists.
    pub served_model_name: String,
    /// Simulated prefill cost per prompt token not found in the cache, microseconds.
    pub prefill_us_per_token: u64,
    /// Simulated decode cost per output token, microseconds.
    pub decode_us_per_token: u64,
    /// One prefill at a time per DP rank, first come first served (the others wait for it).
    pub serial_prefill: bool,
    /// `max_tokens` of a request that gives none.
    pub max_tokens: u32,
    /// Largest request body accepted; a larger one gets 413.
    pub max_request_bytes: usize,
    /// What `usage.prompt_tokens_details.cached_tokens` says: the truth, or a misreport for
    /// testing a router's audit.
    pub cached_report: CachedReport,
}

/// How an engine reports the cached prompt tokens of a request
/// (`usage.prompt_tokens_details.cached_tokens`; the `x-sim-cached-tokens` header and the
/// prefill cost always follow the truth).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CachedReport {
    /// What the engine reused.
    #[default]
    Actual,
    /// Always 0, as an engine whose cache never holds what its events announce.
    Zero,
    /// Half of it, rounded down: a router crediting the truth over-predicts.
    Half,
    /// `prompt_tokens_details: null`, as vLLM without `--enable-prompt-tokens-details`.
    Absent,
}

impl CachedReport {
    /// The reported value for `cached` reused tokens; `None` for no details.
    pub fn report(self, cached: u64) -> Option<u64> {
        match self {
            CachedReport::Actual => Some(cached),
            CachedReport::Zero => Some(0),
            CachedReport::Half => Some(cached / 2),
            CachedReport::Absent => None,
        }
    }
}

impl std::str::FromStr for CachedReport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "actual" => Ok(CachedReport::Actual),
            "zero" => Ok(CachedReport::Zero),
            "half" => Ok(CachedReport::Half),
            "absent" => Ok(CachedReport::Absent),
            _ => Err(format!(
                "--report_cached_tokens {s:?} is not one of actual, zero, half, absent"
            )),
        }
    }
}

impl OpenAiConfig {
    /// `model` served as `served_model_name`, with the default costs: 20 us per uncached prompt
    /// token, 1 ms per output token, 16 output tokens, bodies up to 4 MiB; cached tokens
    /// reported truthfully.
    pub fn new(model: Arc<TextModel>, served_model_name: &str) -> OpenAiConfig {
        OpenAiConfig {
            model,
            served_model_name: served_model_name.to_string(),
            prefill_us_per_token: 20,
            decode_us_per_token: 1000,
            serial_prefill: false,
            max_tokens: 16,
            max_request_bytes: 4 << 20,
            cached_report: CachedReport::Actual,
        }
    }

    /// Problems with the fields, each naming the value and the fix.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.served_model_name.trim().is_empty() {
            problems.push("openai.served_model_name is empty; name the served model".to_string());
        }
        if !(1..=MAX_OUTPUT_TOKENS).contains(&self.max_tokens) {
            problems.push(format!(
                "openai.max_tokens = {} is outside 1..={MAX_OUTPUT_TOKENS}",
                self.max_tokens
            ));
        }
        if self.max_request_bytes < 1024 {
            problems.push(format!(
                "openai.max_request_bytes = {} is below the minimum 1024",
                self.max_request_bytes
            ));
        }
        problems
    }
}

impl PartialEq for OpenAiConfig {
    /// Same model object (by pointer) and same settings.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.model, &other.model)
            && self.served_model_name == other.served_model_name
            && self.prefill_us_per_token == other.prefill_us_per_token
            && self.decode_us_per_token == other.decode_us_per_token
            && self.serial_prefill == other.serial_prefill
            && self.max_tokens == other.max_tokens
            && self.max_request_bytes == other.max_request_bytes
            && self.cached_report == other.cached_report
    }
}

/// OpenAI requests in flight on one engine, at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Admitted and not yet producing tokens: tokenizing, queued for a rank, or prefilling.
    pub waiting: u64,
    /// Producing output tokens.
    pub running: u64,
}

/// Live request counters of one engine, per phase and per DP rank.
#[derive(Debug)]
pub(crate) struct RequestLoad {
    waiting: AtomicU64,
    running: AtomicU64,
    per_rank: Vec<AtomicU64>,
    running_per_rank: Vec<AtomicU64>,
}

impl RequestLoad {
    pub(crate) fn new(dp_size: u32) -> RequestLoad {
        let counters = || (0..dp_size).map(|_| AtomicU64::new(0)).collect();
        RequestLoad {
            waiting: AtomicU64::new(0),
            running: AtomicU64::new(0),
            per_rank: counters(),
            running_per_rank: counters(),
        }
    }

    /// `rank`'s requests: `(waiting, running)`, where waiting is assigned to the rank and not
    /// yet producing tokens (a request still being tokenized has no rank yet).
    pub(crate) fn on_rank_by_phase(&self, rank: u32) -> (u64, u64) {
        let load =
            |v: &Vec<AtomicU64>| v.get(rank as usize).map_or(0, |n| n.load(Ordering::SeqCst));
        let running = load(&self.running_per_rank);
        (load(&self.per_rank).saturating_sub(running), running)
    }

    pub(crate) fn in_flight(&self) -> InFlight {
        InFlight {
            waiting: self.waiting.load(Ordering::SeqCst),
            running: self.running.load(Ordering::SeqCst),
        }
    }

    /// Requests assigned to `rank` and not finished.
    pub(crate) fn on_rank(&self, rank: u32) -> u64 {
        self.per_rank.get(rank as usize).map_or(0, |n| n.load(Ordering::SeqCst))
    }
}

/// One request's place in [`RequestLoad`]: waiting from creation, then on a rank, then
/// running; every count it added is taken back when it drops (finished, failed or cancelled).
#[derive(Debug)]
pub(crate) struct RequestGuard {
    load: Arc<RequestLoad>,
    rank: Option<u32>,
    running: bool,
}

impl RequestGuard {
    pub(crate) fn new(load: Arc<RequestLoad>) -> RequestGuard {
        load.waiting.fetch_add(1, Ordering::SeqCst);
        RequestGuard { load, rank: None, running: false }
    }

    /// The request now belongs to `rank` (once).
    pub(crate) fn assign(&mut self, rank: u32) {
        if self.rank.is_none() {
            if let Some(n) = self.load.per_rank.get(rank as usize) {
                n.fetch_add(1, Ordering::SeqCst);
                self.rank = Some(rank);
            }
        }
    }

    /// Prefill is done: the request moves from waiting to running (once).
    pub(crate) fn start_decode(&mut self) {
        if !self.running {
            self.load.running.fetch_add(1, Ordering::SeqCst);
            self.load.waiting.fetch_sub(1, Ordering::SeqCst);
            if let Some(n) = self.rank.and_then(|r| self.load.running_per_rank.get(r as usize)) {
                n.fetch_add(1, Ordering::SeqCst);
            }
            self.running = true;
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let phase = if self.running { &self.load.running } else { &self.load.waiting };
        phase.fetch_sub(1, Ordering::SeqCst);
        if let Some(r) = self.rank.map(|r| r as usize) {
            let running = self.load.running_per_rank.get(r).filter(|_| self.running);
            for n in self.load.per_rank.get(r).into_iter().chain(running) {
                n.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Why an OpenAI request failed; each becomes OpenAI's error JSON with its status.
#[derive(Debug, Error)]
pub enum ApiError {
    /// The engine was started without a text model.
    #[error(
        "engine {engine} serves no text model; start it with a tokenizer \
         (kvdir-sim --tokenizer_path DIR_OR_FILE, or EngineConfig::openai)"
    )]
    NoModel {
        /// The engine's instance name.
        engine: String,
    },
    /// The body is not JSON, or not a JSON object.
    #[error("the request body is not a JSON object: {0}; send Content-Type: application/json")]
    BadJson(String),
    /// A field is missing or has the wrong type or value.
    #[error("`{field}` {problem}")]
    BadField {
        /// The field, such as `messages`.
        field: &'static str,
        /// What is wrong and what is expected.
        problem: String,
    },
    /// The request names another model.
    #[error("the model `{asked}` does not exist; this engine serves `{served}`")]
    ModelNotFound {
        /// The `model` of the request.
        asked: String,
        /// The served model name.
        served: String,
    },
    /// The body is over the limit.
    #[error("the request body is over {limit} bytes; send a smaller request")]
    TooLarge {
        /// `max_request_bytes`.
        limit: usize,
    },
    /// The chat template or the tokenizer refused the request.
    #[error("cannot tokenize the request: {0}")]
    Tokenize(String),
    /// The engine is stopping (its ranks are gone) or failed internally.
    #[error("the engine cannot serve the request: {0}; retry on another engine")]
    Unavailable(String),
    /// No such route.
    #[error("no route {method} {path}; this engine serves GET /health, GET /metrics, GET /v1/models, POST /tokenize, POST /v1/chat/completions and POST /v1/completions")]
    NotFound {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
}

impl ApiError {
    /// OpenAI's `(type, code)` of the error.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::NoModel { .. } => ("service_unavailable_error", "model_not_loaded"),
            ApiError::BadJson(_) => ("invalid_request_error", "invalid_json"),
            ApiError::BadField { .. } => ("invalid_request_error", "invalid_value"),
            ApiError::ModelNotFound { .. } => ("invalid_request_error", "model_not_found"),
            ApiError::TooLarge { .. } => ("invalid_request_error", "request_too_large"),
            ApiError::Tokenize(_) => ("invalid_request_error", "invalid_prompt"),
            ApiError::Unavailable(_) => ("service_unavailable_error", "engine_unavailable"),
            ApiError::NotFound { .. } => ("invalid_request_error", "not_found"),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::NoModel { .. } | ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::ModelNotFound { .. } | ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let (kind, code) = self.kind();
        HttpResponse::build(self.status_code()).json(json!({
            "error": { "message": self.to_string(), "type": kind, "code": code }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_waits_on_its_rank_then_runs_there_then_leaves() {
        let load = Arc::new(RequestLoad::new(2));
        let mut guard = RequestGuard::new(Arc::clone(&load));
        assert_eq!(load.on_rank_by_phase(1), (0, 0), "no rank before assignment");
        guard.assign(1);
        assert_eq!((load.on_rank_by_phase(1), load.on_rank_by_phase(0)), ((1, 0), (0, 0)));
        guard.start_decode();
        assert_eq!(load.on_rank_by_phase(1), (0, 1));
        drop(guard);
        assert_eq!(load.on_rank_by_phase(1), (0, 0));
        assert_eq!(load.in_flight(), InFlight::default());
    }
}
