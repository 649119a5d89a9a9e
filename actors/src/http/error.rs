//! [`ApiError`], every error an HTTP client of the internal API can see, and the one place
//! errors become statuses: [`ApiError::kind`] then [`ErrorKind::status`] (the kind is also the
//! `reason` label of `kvdir_http_errors_total`). The front door's [`FrontError`] answers in
//! OpenAI's error JSON, with its own match below.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use kvdir::car::RouteError;
use kvdir::indexer_api::IndexerError;
use kvdir::query::QueryError;
use kvdir::registry::HeartbeatError;
use serde::Serialize;
use thiserror::Error;

use super::frontdoor::FrontError;
use crate::stream::StartStreamError;

/// Every error an HTTP client can see.
#[derive(Debug, Error)]
pub enum ApiError {
    /// Missing or wrong `X-Internal-Token`.
    #[error("missing or wrong X-Internal-Token header")]
    Unauthorized,
    /// The body could not be read or is not a valid request.
    #[error("{0}")]
    BadRequest(String),
    /// A query or route body that breaks the token rules.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A `/register` or `/unregister` body that is not valid.
    #[error(transparent)]
    Indexer(#[from] IndexerError),
    /// The body is larger than `--max_request_bytes`.
    #[error("request body exceeds --max_request_bytes = {0}")]
    PayloadTooLarge(usize),
    /// A heartbeat that names no registered instance, or a stale incarnation.
    #[error("{0}")]
    Conflict(String),
    /// The heartbeat names an unknown instance or a stale incarnation.
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatError),
    /// A stream that cannot start next to the running ones (`/register`).
    #[error(transparent)]
    Stream(#[from] StartStreamError),
    /// No instance can take the request.
    #[error(transparent)]
    NoCandidate(#[from] RouteError),
    /// An actor did not answer (shutting down).
    #[error("service unavailable: {0}")]
    Unavailable(#[from] actix::MailboxError),
    /// No such route.
    #[error("no route for {0}; see the HTTP API table in docs/http-api.md")]
    NotFound(String),
    /// No such stream (`POST /unregister`).
    #[error("{0}")]
    UnknownStream(String),
    /// A route kvdir knows but does not implement, with the reason.
    #[error("{0}")]
    NotImplemented(String),
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

/// What kind of failure an [`ApiError`] is: its status and its `reason` label in
/// `kvdir_http_errors_total`. Several errors share a kind (a bad token list and a bad body are
/// both `bad_request`); two kinds share 503 but are counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 401.
    Unauthorized,
    /// 400.
    BadRequest,
    /// 413.
    PayloadTooLarge,
    /// 409.
    Conflict,
    /// 503: no instance can take the request.
    NoCandidate,
    /// 503: an actor did not answer.
    Unavailable,
    /// 404.
    NotFound,
    /// 501.
    NotImplemented,
}

impl ErrorKind {
    /// Every kind, in declaration order (`kind as usize` is its position).
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Unauthorized,
        ErrorKind::BadRequest,
        ErrorKind::PayloadTooLarge,
        ErrorKind::Conflict,
        ErrorKind::NoCandidate,
        ErrorKind::Unavailable,
        ErrorKind::NotFound,
        ErrorKind::NotImplemented,
    ];

    /// The status an error of this kind answers with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::NoCandidate | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::NotImplemented => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// Its `reason` label in `kvdir_http_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::Conflict => "conflict",
            ErrorKind::NoCandidate => "no_candidate",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NotFound => "not_found",
            ErrorKind::NotImplemented => "not_implemented",
        }
    }
}

impl ApiError {
    /// This error's kind. With [`ErrorKind::status`], the one place errors become statuses.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::Unauthorized => ErrorKind::Unauthorized,
            ApiError::BadRequest(_) | ApiError::Query(_) | ApiError::Indexer(_) => {
                ErrorKind::BadRequest
            }
            ApiError::PayloadTooLarge(_) => ErrorKind::PayloadTooLarge,
            ApiError::Conflict(_) | ApiError::Heartbeat(_) | ApiError::Stream(_) => {
                ErrorKind::Conflict
            }
            ApiError::NoCandidate(_) => ErrorKind::NoCandidate,
            ApiError::Unavailable(_) => ErrorKind::Unavailable,
            ApiError::NotFound(_) | ApiError::UnknownStream(_) => ErrorKind::NotFound,
            ApiError::NotImplemented(_) => ErrorKind::NotImplemented,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.kind().status()
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(ErrorBody { error: self.to_string() })
    }
}

/// The front door's errors, in OpenAI's error JSON.
impl ResponseError for FrontError {
    fn status_code(&self) -> StatusCode {
        match self {
            FrontError::Unauthorized => StatusCode::UNAUTHORIZED,
            FrontError::Invalid { .. } => StatusCode::BAD_REQUEST,
            FrontError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            FrontError::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            FrontError::NotConfigured | FrontError::NoInstance(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            FrontError::Upstream(_) => StatusCode::BAD_GATEWAY,
            FrontError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            FrontError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            FrontError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if let Some(seconds) = self.retry_after_s() {
            response.insert_header(("retry-after", seconds.to_string()));
        }
        response.json(self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    /// `/metrics` counts errors in an array indexed by `kind as usize`, labelled from `ALL`.
    #[test]
    fn every_error_kind_is_listed_once_at_its_position() {
        for (i, kind) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind:?}");
        }
        let mut labels: Vec<_> = ErrorKind::ALL.iter().map(|k| k.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ErrorKind::ALL.len());
    }
}
