//! Route and forward: the chosen instance gets the client's original body (with
//! `stream_options.include_usage` added for the audit when a streaming client left it out) at
//! the same path (`http://<instance name = host:port>/v1/...`, or a listed engine's `url` +
//! `/v1/...`); its answer streams back chunk by chunk as it arrives, never buffered whole.
//!
//! - A failure before the engine answered (nothing reached the client yet) is retried once on
//!   the next-best instance; the failed one is left out of that second decision. Waiting longer
//!   than `--upstream_timeout_ms` for the response head is not retried (the engine may be
//!   working on it), nor is anything after the first byte.
//! - The request counts in flight at its instance ([`crate::router::RouteForward`]) until
//!   its first byte, and is finished when the answer ends or the client goes away: dropping the
//!   relayed body drops the upstream response, which closes the engine connection and so
//!   cancels the request there.
//! - Responses carry `x-kvdir-instance`, `x-kvdir-kv-hit-ratio` and `x-kvdir-policy`, and
//!   `x-kvdir-dp-rank` where kvdir chose the DP rank.
//! - DP ranks: where the engine takes the rank with the request (vLLM, SGLang), the router
//!   chooses one and it goes to the engine in `X-data-parallel-rank`; a client's own
//!   `X-data-parallel-rank` is passed through unchanged (and is the rank scored and credited).
//!   Elsewhere the engine picks and no header is added.
//! - The answer passes through [`audit::tap`], which reads its usage for the cache audit.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::HttpResponse;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use kvdir::car::{CacheState, RequestId, Routed};
use kvdir::query::QueryScope;

use super::audit::{self, UsagePlan};
use super::request::ApiKind;
use super::{FrontError, FrontMetrics};
use crate::http::AppState;
use crate::router::{Answer, RequestProgress, RouteForward, RouterActor};

/// The request header naming the DP rank that serves a request (vLLM, SGLang).
pub const RANK_HEADER: &str = "x-data-parallel-rank";

/// What goes to the engine besides the body: the API called and the client's own
/// `X-data-parallel-rank`, passed through unchanged.
pub struct Outgoing {
    /// Chat or completions.
    pub kind: ApiKind,
    /// The client's rank header, as sent.
    pub client_rank: Option<String>,
}

impl Outgoing {
    /// The API called, and the rank header of `req`.
    pub fn new(kind: ApiKind, req: &actix_web::HttpRequest) -> Self {
        let client_rank = req.headers().get(RANK_HEADER).and_then(|v| v.to_str().ok());
        Outgoing { kind, client_rank: client_rank.map(str::to_string) }
    }

    /// The rank header the engine gets: the client's, else kvdir's choice, if any.
    fn rank_header(&self, chosen: Option<u32>) -> Option<String> {
        self.client_rank.clone().or_else(|| chosen.map(|r| r.to_string()))
    }
}

/// Routes the request and relays the chosen engine's answer.
pub async fn run(
    state: &web::Data<AppState>,
    out: Outgoing,
    body: Vec<u8>,
    tokens: Vec<i32>,
    scope: &QueryScope,
    usage: UsagePlan,
) -> Result<HttpResponse, FrontError> {
    let started = Instant::now();
    let body = Bytes::from(body);
    let read = state.directory.read_route(&tokens, scope);
    let prompt = kvdir::car::prompt_id(&tokens);
    let mut failed: Vec<(String, String)> = Vec::new();
    let pinned_rank = out.client_rank.as_deref().and_then(|r| r.trim().parse().ok());
    loop {
        let exclude = failed.iter().map(|f| f.0.clone()).collect();
        let (input_tokens, read) = (tokens.len(), read.clone());
        let msg = RouteForward { input_tokens, read, exclude, prompt, pinned_rank };
        let (routed, id, url) = match super::admission::route(state, msg, failed.is_empty()).await?
        {
            Ok(r) => r,
            Err(e) if failed.is_empty() => return Err(FrontError::NoInstance(e.to_string())),
            Err(e) => return Err(unreachable(&failed, Some(&e.to_string()))),
        };
        let progress = Progress::new(state.router.clone(), routed.prefill.clone(), id);
        let rank = out.rank_header(routed.dp_rank);
        match send(state, (out.kind, rank), &url, body.clone()).await {
            Ok(response) => return Ok(relay(state, response, &routed, progress, (started, usage))),
            Err(Some(e)) => {
                tracing::warn!(instance = %routed.prefill, error = %e, "engine unreachable");
                state.front.metrics.count_failed(&routed.prefill);
                failed.push((routed.prefill.clone(), e.to_string()));
                if failed.len() == 2 {
                    return Err(unreachable(&failed, None));
                }
            }
            Err(None) => {
                return Err(FrontError::UpstreamTimeout(format!(
                    "{} sent no response head within --upstream_timeout_ms = {} ms",
                    routed.prefill,
                    state.front.upstream_timeout.as_millis()
                )))
            }
        }
    }
}

/// POSTs `body` to the instance at `base_url`, with the rank header when there is a rank;
/// `Err(None)` when it took longer than `--upstream_timeout_ms`
/// (the engine has the request and is slow: retrying would run it twice), `Err(Some(e))` when
/// it could not be reached.
async fn send(
    state: &AppState,
    (kind, rank): (ApiKind, Option<String>),
    base_url: &str,
    body: Bytes,
) -> Result<reqwest::Response, Option<reqwest::Error>> {
    let mut request = state
        .front
        .client
        .post(format!("{base_url}{}", kind.path()))
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(rank) = rank {
        request = request.header(RANK_HEADER, rank);
    }
    let request = request.body(body).send();
    match tokio::time::timeout(state.front.upstream_timeout, request).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) if e.is_timeout() => Err(None),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}

fn unreachable(failed: &[(String, String)], then: Option<&str>) -> FrontError {
    let tried: Vec<String> = failed.iter().map(|(i, e)| format!("{i} ({e})")).collect();
    let mut message = format!("no engine could be reached: {}", tried.join(", then "));
    if let Some(then) = then {
        message.push_str(&format!("; no other instance: {then}"));
    }
    FrontError::Upstream(message)
}

/// The engine's status, content type and body, plus kvdir's headers.
fn relay(
    state: &web::Data<AppState>,
    response: reqwest::Response,
    routed: &Routed,
    progress: Progress,
    (started, usage): (Instant, UsagePlan),
) -> HttpResponse {
    let status =
        StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    state.front.metrics.count_status(&routed.prefill, status.as_u16());
    let chosen = routed.candidates.iter().find(|c| c.name == routed.prefill);
    let ratio = chosen.and_then(|c| c.kv_hit_ratio).unwrap_or(0.0);
    let (cached, sync) = chosen.map_or((0, CacheState::Unsynchronized), |c| c.cached_tokens());
    let mut out = HttpResponse::build(status);
    if let Some(ct) = response.headers().get(reqwest::header::CONTENT_TYPE) {
        out.insert_header(("content-type", ct.as_bytes()));
    }
    out.insert_header(("x-kvdir-instance", routed.prefill.as_str()))
        .insert_header(("x-kvdir-kv-hit-ratio", format!("{ratio:.4}")))
        .insert_header(("x-kvdir-cached-tokens", cached.to_string()))
        .insert_header(("x-kvdir-stream-state", sync.as_str()))
        .insert_header(("x-kvdir-policy", policy_name(routed)));
    if let Some(rank) = routed.dp_rank {
        out.insert_header(("x-kvdir-dp-rank", rank.to_string()));
    }
    let metrics = state.front.metrics.clone();
    let sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"text/event-stream"));
    let inner = audit::tap(audit::Audited {
        inner: response.bytes_stream().boxed(),
        ok: status.is_success(),
        sse,
        plan: usage,
        instance: routed.prefill.clone(),
        credit: (cached, sync),
        audit: metrics.audit.clone(),
    });
    let mut progress = progress;
    progress.answer = if sse { Answer::Streamed } else { Answer::Whole };
    out.streaming(Relay { inner, progress, started, metrics })
}

fn policy_name(routed: &Routed) -> String {
    serde_json::to_value(routed.policy)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Tells the router how a forwarded request is doing; "finished" when dropped.
struct Progress {
    router: Addr<RouterActor>,
    instance: String,
    id: RequestId,
    answered: bool,
    /// Whether the answer streams (its first byte is the first token) or comes whole.
    answer: Answer,
}

impl Progress {
    fn new(router: Addr<RouterActor>, instance: String, id: RequestId) -> Self {
        Progress { router, instance, id, answered: false, answer: Answer::Whole }
    }

    fn first_byte(&mut self) {
        if !self.answered {
            self.answered = true;
            let msg = RequestProgress::FirstByte(self.instance.clone(), self.id, self.answer);
            self.router.do_send(msg);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.router.do_send(RequestProgress::Finished(std::mem::take(&mut self.instance), self.id));
    }
}

/// The engine's body, passed through as it arrives.
struct Relay {
    inner: BoxStream<'static, reqwest::Result<Bytes>>,
    progress: Progress,
    started: Instant,
    metrics: std::sync::Arc<FrontMetrics>,
}

impl Stream for Relay {
    type Item = Result<Bytes, reqwest::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(Some(Ok(_))) = &next {
            if !self.progress.answered {
                self.metrics.time_to_first_byte.observe(self.started.elapsed());
                self.progress.first_byte();
            }
        }
        next
    }
}
