//! The OpenAI-compatible front door: `POST /v1/chat/completions`, `POST /v1/completions` and
//! `GET /v1/models` on kvdir's HTTP port.
//!
//! A request is authorized (`--api_key`, Bearer; separate from the internal token), read up to
//! `--max_request_bytes`, parsed ([`request`]), tokenized on actix's blocking pool exactly as the
//! engine does (`kvdir-text`: chat template, then the tokenizer; at most `--max_query_tokens`),
//! routed in process with the configured policy over the directory and the instance
//! registry, and forwarded (untouched, but for the audit's `stream_options.include_usage`) to
//! the chosen instance ([`forward`]), whose answer streams back chunk by chunk. Errors use OpenAI's error JSON ([`FrontError`]; its status codes are
//! mapped in [`crate::http`], with the internal API's).
//!
//! Each complete answer is audited ([`audit`]): the cached tokens the engine reports against
//! kvdir's credit.
//!
//! Without `--tokenizer_path` the front door answers 503; the internal API works either way.

mod admission;
mod audit;
mod forward;
mod metrics;
pub mod request;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse};
use kvdir::config::FrontDoorFlags;
use kvdir::index::Namespace;
use kvdir::query::QueryScope;
use kvdir_text::{TextError, TextModel};
use serde_json::json;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::http::{read_body, AppState};
pub use admission::render as render_overload;
pub use metrics::FrontMetrics;
use request::{ApiKind, Prompt};

/// What the front door's handlers share.
pub struct FrontDoor {
    model: Option<Arc<TextModel>>,
    served_model_name: String,
    lora_adapters: Vec<String>,
    api_key: Option<String>,
    client: reqwest::Client,
    upstream_timeout: Duration,
    /// Requests by instance and status, time to first byte, tokenization time.
    pub metrics: Arc<FrontMetrics>,
}

/// The front door could not be set up from its flags.
#[derive(Debug, Error)]
pub enum FrontDoorSetupError {
    /// The tokenizer or template did not load.
    #[error("--tokenizer_path: {0}")]
    Text(#[from] TextError),
    /// The HTTP client could not be built.
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(String),
}

impl FrontDoor {
    /// Loads the tokenizer named by the flags, if any.
    pub fn new(flags: &FrontDoorFlags) -> Result<FrontDoor, FrontDoorSetupError> {
        let model = match &flags.tokenizer_path {
            Some(p) => Some(Arc::new(TextModel::load(p, flags.chat_template.as_deref())?)),
            None => None,
        };
        let served_model_name = flags
            .served_model_name
            .clone()
            .or_else(|| flags.tokenizer_path.as_deref().and_then(model_dir_name))
            .unwrap_or_else(|| "kvdir".into());
        let upstream_timeout = Duration::from_millis(flags.upstream_timeout_ms);
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(flags.upstream_connect_timeout_ms))
            .read_timeout(upstream_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| FrontDoorSetupError::Client(e.to_string()))?;
        Ok(FrontDoor {
            model,
            served_model_name,
            lora_adapters: flags.lora_adapters.clone(),
            api_key: flags.api_key.clone(),
            client,
            upstream_timeout,
            metrics: Arc::default(),
        })
    }

    /// The tokenizer and chat template, when `--tokenizer_path` names one.
    pub fn text_model(&self) -> Option<Arc<TextModel>> {
        self.model.clone()
    }

    fn authorize(&self, req: &HttpRequest) -> Result<(), FrontError> {
        let Some(key) = &self.api_key else { return Ok(()) };
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            Ok(())
        } else {
            Err(FrontError::Unauthorized)
        }
    }

    /// Which streams and keys a request for `model` (the served model or one of its LoRA
    /// adapters) with `cache_salt` may get credit from.
    pub fn scope(&self, model: &str, cache_salt: &str) -> Result<QueryScope, FrontError> {
        let lora = if model == self.served_model_name {
            0
        } else if self.lora_adapters.iter().any(|a| a == model) {
            Namespace::lora_name(model.as_bytes())
        } else {
            return Err(FrontError::ModelNotFound {
                given: model.to_string(),
                served: self.served_model_name.clone(),
            });
        };
        Ok(QueryScope {
            model: self.served_model_name.clone(),
            namespace: Namespace { lora, salt: Namespace::salt(cache_salt.as_bytes()) },
            ..QueryScope::default()
        })
    }
}

/// The last component of the tokenizer's directory (the usual model name).
fn model_dir_name(path: &Path) -> Option<String> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    dir.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Every error a front door client can see, as OpenAI's error JSON.
#[derive(Debug, Error)]
pub enum FrontError {
    /// Missing or wrong API key.
    #[error("invalid API key: send `Authorization: Bearer <key>` with the key kvdir was started with (--api_key)")]
    Unauthorized,
    /// The request is not valid.
    #[error("{message}")]
    Invalid {
        /// What is wrong and how to fix it.
        message: String,
        /// The offending field, if one.
        param: Option<String>,
    },
    /// The body is larger than `--max_request_bytes`.
    #[error("request body exceeds --max_request_bytes = {0}")]
    TooLarge(usize),
    /// The request names another model.
    #[error(
        "the model `{given}` does not exist here; this kvdir serves `{served}` (GET /v1/models)"
    )]
    ModelNotFound {
        /// The model asked for.
        given: String,
        /// The model served.
        served: String,
    },
    /// No tokenizer was configured.
    #[error(
        "the OpenAI front door is off: start kvdir with --tokenizer_path pointing at the served \
         model's tokenizer.json (or its directory); the internal API works without it"
    )]
    NotConfigured,
    /// No instance can take the request.
    #[error("{0}")]
    NoInstance(String),
    /// The chosen engines could not be reached.
    #[error("{0}")]
    Upstream(String),
    /// The engine did not answer in time.
    #[error("{0}")]
    UpstreamTimeout(String),
    /// Something in kvdir failed (shutting down, a panicked tokenizer task).
    #[error("{0}")]
    Internal(String),
    /// Every engine is behind and the overload queue is full (429 with `Retry-After`).
    #[error("{}", admission::refusal_message(.0))]
    Overloaded(kvdir::overload::Refusal),
}

impl FrontError {
    /// A 400 with `message`, naming `param`.
    pub fn invalid(message: String, param: Option<String>) -> Self {
        FrontError::Invalid { message, param }
    }

    /// OpenAI's `type` and `code`, and the `reason` label of the front door's metrics.
    pub fn kind(&self) -> (&'static str, &'static str) {
        match self {
            FrontError::Unauthorized => ("authentication_error", "invalid_api_key"),
            FrontError::Invalid { .. } => ("invalid_request_error", "invalid_request"),
            FrontError::TooLarge(_) => ("invalid_request_error", "request_too_large"),
            FrontError::ModelNotFound { .. } => ("invalid_request_error", "model_not_found"),
            FrontError::NotConfigured => ("server_error", "front_door_not_configured"),
            FrontError::NoInstance(_) => ("server_error", "no_instance"),
            FrontError::Upstream(_) => ("server_error", "upstream_unreachable"),
            FrontError::UpstreamTimeout(_) => ("server_error", "upstream_timeout"),
            FrontError::Internal(_) => ("server_error", "internal_error"),
            FrontError::Overloaded(_) => ("rate_limit_error", "overloaded"),
        }
    }

    /// `Retry-After`, in seconds, when the client should come back later.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            FrontError::Overloaded(r) => Some(r.retry_after_s),
            _ => None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let param = match self {
            FrontError::Invalid { param, .. } => param.clone(),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl From<TextError> for FrontError {
    fn from(e: TextError) -> Self {
        let param = matches!(e, TextError::Template(_)).then(|| "messages".to_string());
        FrontError::invalid(e.to_string(), param)
    }
}

impl From<actix::MailboxError> for FrontError {
    fn from(e: actix::MailboxError) -> Self {
        FrontError::Internal(format!("service unavailable: {e}"))
    }
}

/// Registers the public routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/chat/completions", web::post().to(chat))
        .route("/v1/completions", web::post().to(completions))
        .route("/v1/models", web::get().to(models));
}

async fn chat(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, FrontError> {
    serve(ApiKind::Chat, req, payload, state).await
}

async fn completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, FrontError> {
    serve(ApiKind::Completion, req, payload, state).await
}

async fn models(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, FrontError> {
    let front = &state.front;
    front.authorize(&req)?;
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": std::iter::once(&front.served_model_name)
            .chain(&front.lora_adapters)
            .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "kvdir",
                             "ready": front.model.is_some()}))
            .collect::<Vec<_>>(),
    })))
}

/// Authorize, read, parse, tokenize, then route and forward.
async fn serve(
    kind: ApiKind,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, FrontError> {
    let result = async {
        let front = &state.front;
        front.authorize(&req)?;
        let model = front.model.clone().ok_or(FrontError::NotConfigured)?;
        let body =
            read_body(payload, &req, state.max_request_bytes).await.map_err(|e| match e {
                crate::http::ApiError::PayloadTooLarge(n) => FrontError::TooLarge(n),
                other => FrontError::invalid(other.to_string(), None),
            })?;
        let parsed = request::parse(kind, &body)?;
        let scope = front.scope(&parsed.model, &parsed.cache_salt)?;
        let (body, usage) = audit::UsagePlan::prepare(body, &parsed);
        let started = Instant::now();
        let max = state.max_query_tokens;
        let tokens = web::block(move || tokenize(&model, parsed.prompt, max))
            .await
            .map_err(|e| FrontError::Internal(format!("tokenizer task failed: {e}")))??;
        front.metrics.tokenization.observe(started.elapsed());
        forward::run(&state, forward::Outgoing::new(kind, &req), body, tokens, &scope, usage).await
    };
    let result = result.await;
    if let Err(e) = &result {
        state.front.metrics.count(None, e);
    }
    result
}

/// The token ids the engine will compute for `prompt`, as the index's `i32`s.
fn tokenize(model: &TextModel, prompt: Prompt, max_tokens: usize) -> Result<Vec<i32>, FrontError> {
    let ids = match prompt {
        Prompt::Chat { messages, tools, add_generation_prompt } => {
            let text = model.chat_prompt(&messages, tools.as_ref(), add_generation_prompt)?;
            model.encode(&text, false)?
        }
        Prompt::Text(text) => model.encode(&text, true)?,
        Prompt::Tokens(ids) => ids,
    };
    if ids.len() > max_tokens {
        return Err(FrontError::invalid(
            format!(
                "the prompt has {} tokens, more than --max_query_tokens = {max_tokens}; shorten it \
                 or raise the flag",
                ids.len()
            ),
            Some("messages".into()),
        ));
    }
    ids.into_iter()
        .map(|t| {
            i32::try_from(t).map_err(|_| {
                FrontError::invalid(format!("token id {t} is out of range"), Some("prompt".into()))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_names_the_namespace_and_the_salt_joins_it() {
        let flags = FrontDoorFlags {
            served_model_name: Some("base".into()),
            lora_adapters: vec!["sql".into()],
            ..FrontDoorFlags::default()
        };
        let front = FrontDoor::new(&flags).unwrap();
        let base = front.scope("base", "").unwrap();
        assert_eq!((base.model.as_str(), base.namespace), ("base", Namespace::default()));
        let sql = front.scope("sql", "").unwrap();
        assert_eq!(sql.namespace.lora, Namespace::lora_name(b"sql"));
        assert_eq!(sql.model, "base", "an adapter runs on the served model's engines");
        let salted = front.scope("base", "tenant-7").unwrap();
        assert_eq!(salted.namespace, Namespace { lora: 0, salt: Namespace::salt(b"tenant-7") });
        let err = front.scope("other", "").unwrap_err();
        assert!(matches!(err, FrontError::ModelNotFound { .. }), "{err}");
    }
}
