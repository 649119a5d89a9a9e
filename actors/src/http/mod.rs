//! The HTTP API (actix-web). Errors and their statuses are in `error.rs` ([`ApiError`]), the
//! one place that maps errors to status codes.
//!
//! Routes: `POST /v1/internal/kv-cache/query`, `GET /v1/internal/streams`,
//! `POST /v1/internal/route`, `GET /v1/internal/route/recent`, `POST /v1/internal/heartbeat`,
//! `GET /v1/internal/instances`, the indexer API ([`indexer_api`]), `GET /health`, `GET /metrics` (Prometheus text; like `/health`,
//! it needs no token), and `GET /`, the status page ([`status_page`]; static, served
//! without a token: its script sends the token).
//! Internal routes need `X-Internal-Token` when a token is configured; it is compared in
//! constant time. Bodies are read up to `--max_request_bytes`, then parsed strictly.

mod descriptors;
mod error;
pub mod frontdoor;
mod indexer_api;
pub mod metrics;
mod status_page;
mod timing;

use std::sync::Arc;
use std::time::Instant;

use actix::Addr;
use actix_web::http::header::ContentType;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use kvdir::query::{parse_scoped_query, QueryScope};
use kvdir::registry::HeartbeatBody;
use subtle::ConstantTimeEq;

use crate::directory::Directory;
use crate::discovery::{Beats, DiscoveryActor, GetInstances, Heartbeat};
use crate::router::{GetOverload, GetPredictCounters, GetRecentRoutes, RouteRequest};
use crate::router::{RouterActor, RouterHandle};
use crate::stream::{GetStreamReport, StreamCounters, StreamReport};
use crate::stream::{StreamMap, StreamSet};
pub use error::{ApiError, ErrorKind};
use frontdoor::FrontDoor;
pub use metrics::ServiceMetrics;
use metrics::{Endpoint, StreamSample};
use timing::{Stages, SERVER_TIMING};

/// What the handlers share.
pub struct AppState {
    /// The router's messages (recent decisions, counters, overload admission).
    pub router: Addr<RouterActor>,
    /// The router's state: requests are decided on the handler's thread.
    pub route: RouterHandle,
    /// The KV-cache directory, read directly by the handlers.
    pub directory: Arc<Directory>,
    /// Every running stream.
    pub streams: StreamMap,
    /// Starts and stops streams (`POST /register`, `POST /unregister`).
    pub set: StreamSet,
    /// Discovery, when configured.
    pub discovery: Option<Addr<DiscoveryActor>>,
    /// Heartbeats queued for discovery, checked against the incarnations it publishes.
    pub beats: Arc<Beats>,
    /// Required `X-Internal-Token`, if any.
    pub token: Option<String>,
    /// Largest body.
    pub max_request_bytes: usize,
    /// Largest token list.
    pub max_query_tokens: usize,
    /// Request latencies and errors.
    pub metrics: Arc<ServiceMetrics>,
    /// The OpenAI-compatible front door.
    pub front: Arc<FrontDoor>,
}

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/metrics", web::get().to(prometheus))
        .route("/v1/internal/kv-cache/query", web::post().to(query))
        .route("/v1/internal/streams", web::get().to(streams))
        .route("/v1/internal/heartbeat", web::post().to(heartbeat))
        .route("/v1/internal/route", web::post().to(route_request))
        .route("/v1/internal/instances", web::get().to(instances))
        .route("/v1/internal/route/recent", web::get().to(recent_routes))
        .route("/", web::get().to(status_page::page))
        .configure(indexer_api::routes)
        .configure(frontdoor::routes)
        .default_service(web::to(not_found));
}

async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!("{} {}", req.method(), req.path())))
}

pub(crate) fn authorize(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    let Some(expected) = &state.token else { return Ok(()) };
    let given = req.headers().get("X-Internal-Token").map(|v| v.as_bytes()).unwrap_or_default();
    if bool::from(given.ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Reads the body up to the limit; a declared or actual size over it is a 413.
pub(crate) async fn read_body(
    mut payload: web::Payload,
    req: &HttpRequest,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("cannot read body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The body of an internal POST: the token checked, then read up to `--max_request_bytes`.
pub(crate) async fn authorized_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<Vec<u8>, ApiError> {
    authorize(req, state)?;
    read_body(payload, req, state.max_request_bytes).await
}

/// The checks shared by the query and route endpoints: token, body limit, strict token ids;
/// and the query's scope (model, namespace, ...).
pub(crate) async fn read_tokens(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<(Vec<i32>, QueryScope), ApiError> {
    let body = authorized_body(req, payload, state).await?;
    Ok(parse_scoped_query(&body, state.max_query_tokens)?)
}

/// Records a request's latency and, if it failed, its error reason.
pub(crate) fn observed<T>(
    state: &AppState,
    endpoint: Endpoint,
    started: Instant,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    state.metrics.observe(endpoint, started, result.as_ref().err());
    result
}

async fn query(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut stages = Stages::start(&req);
    let result = async {
        let (tokens, scope) = timed_tokens(&req, payload, &state, &mut stages).await?;
        // serde_json's bytes for the QueryResponse, faster (kvdir::query's fast path).
        let json = state.directory.query_json_in(&tokens, &scope);
        stages.end("read");
        Ok(json)
    };
    let result = result.await;
    let json = observed(&state, Endpoint::Query, stages.started(), result)?;
    Ok(timed_json(&state, Endpoint::Query, &stages, json))
}

async fn route_request(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut stages = Stages::start(&req);
    let result = async {
        let (tokens, scope) = timed_tokens(&req, payload, &state, &mut stages).await?;
        let read = state.directory.read_route(&tokens, &scope);
        stages.end("read");
        // Decided on this thread, under the router's lock: no hop to the router's thread.
        let (routed, waited) = state.route.route(RouteRequest { input_tokens: tokens.len(), read });
        stages.split(("lock", waited), "decide");
        // Plain fields and string keys: serde_json cannot fail on it (a NaN becomes null).
        let json = serde_json::to_vec(&routed?).expect("a decision serializes");
        stages.end("json");
        Ok(json)
    };
    let result = result.await;
    let json = observed(&state, Endpoint::Route, stages.started(), result)?;
    Ok(timed_json(&state, Endpoint::Route, &stages, json))
}

/// A JSON answer carrying its handler's stages as `Server-Timing`, which `/metrics` counts too.
fn timed_json(
    state: &AppState,
    endpoint: Endpoint,
    stages: &Stages,
    json: Vec<u8>,
) -> HttpResponse {
    state.metrics.observe_stages(endpoint, stages);
    HttpResponse::Ok()
        .content_type(ContentType::json())
        .insert_header((SERVER_TIMING, stages.header()))
        .body(json)
}

/// [`read_tokens`], its stages timed: `body`, then `parse`.
async fn timed_tokens(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    stages: &mut Stages,
) -> Result<(Vec<i32>, QueryScope), ApiError> {
    let body = authorized_body(req, payload, state).await?;
    stages.end("body");
    let parsed = parse_scoped_query(&body, state.max_query_tokens)?;
    stages.end("parse");
    Ok(parsed)
}

async fn recent_routes(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let recent = state.router.send(GetRecentRoutes).await?;
    let overload = state.router.send(GetOverload).await?;
    let mut body = serde_json::to_value(recent).unwrap_or_default();
    body["overload"] = serde_json::to_value(overload).unwrap_or_default();
    Ok(HttpResponse::Ok().json(body))
}

/// Every running stream's report with its counters, ordered by instance and rank.
async fn stream_reports(
    state: &AppState,
) -> Result<Vec<(StreamReport, Arc<StreamCounters>)>, ApiError> {
    let running: Vec<_> = crate::sync::read(&state.streams)
        .values()
        .map(|r| {
            // A bound stream shows its rank's bound port and its engine's topic.
            let bound = state.set.bind().filter(|_| kvdir::config::is_bound(&r.spec.endpoint));
            let endpoint = bound.map(|b| b.describe(&r.spec.topic, r.spec.dp_rank));
            (r.stream.clone(), Arc::clone(&r.counters), endpoint)
        })
        .collect();
    let mut reports = Vec::with_capacity(running.len());
    for (s, counters, endpoint) in running {
        let mut report = s.send(GetStreamReport).await?;
        report.endpoint = endpoint.unwrap_or(report.endpoint);
        reports.push((report, counters));
    }
    reports.sort_by(|(a, _), (b, _)| {
        (&a.instance_name, a.dp_rank).cmp(&(&b.instance_name, b.dp_rank))
    });
    Ok(reports)
}

async fn prometheus(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let reports = stream_reports(&state).await?;
    let views = state.directory.query(&[]).matches;
    let samples: Vec<StreamSample> = reports
        .into_iter()
        .map(|(report, counters)| {
            // Both are ordered by instance name, then rank: a binary search, not a scan per
            // stream (8 million name comparisons at 4,096 streams).
            let key = (report.instance_name.as_str(), report.dp_rank);
            let at = views.partition_point(|v| (v.instance_name.as_str(), v.dp_rank) < key);
            let view = views
                .get(at)
                .filter(|v| v.instance_name == report.instance_name && v.dp_rank == report.dp_rank)
                .cloned();
            StreamSample { report, view, counters }
        })
        .collect();
    let predictions = state.router.send(GetPredictCounters).await?;
    let overload = state.router.send(GetOverload).await?;
    let parity = match &state.discovery {
        Some(d) => metrics::parity_of(&d.send(GetInstances).await?),
        None => Vec::new(),
    };
    let service = metrics::ServiceSample {
        parity,
        metrics: &state.metrics,
        front: &state.front.metrics,
        predictions,
        overload,
        rss: metrics::resident_bytes(),
        bind: state.set.bind().map(|b| b.report()),
        pool: state.set.pool().stats(),
    };
    let text = metrics::render(&samples, &service);
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(text))
}

async fn streams(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let reports: Vec<StreamReport> =
        stream_reports(&state).await?.into_iter().map(|(r, _)| r).collect();
    let pool = state.set.pool().stats();
    let mut body = serde_json::json!({
        "streams": reports,
        "io_threads": pool.io_threads,
        "replays_waiting": pool.replays_waiting,
    });
    if let Some(b) = state.set.bind() {
        body["bind"] = serde_json::json!(b.report());
    }
    Ok(HttpResponse::Ok().json(body))
}

/// A heartbeat's answer: the same bytes every time, built once.
const HEARTBEAT_OK: &str = r#"{"status":"ok"}"#;

/// Two thousand a second from a thousand engines: parsed without a JSON tree, settled against
/// discovery's published view without an allocation or a message, answered with fixed bytes.
async fn heartbeat(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = authorized_body(&req, payload, &state).await?;
    let hb: HeartbeatBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "heartbeat body: {e}; expected {{\"name\", \"incarnation_id\", \"load_metrics\": \
             {{\"waiting_requests_num\": an integer >= 0, \"gpu_cache_usage_perc\": 0..=1}}}}"
        ))
    })?;
    let load =
        hb.load_metrics.check().map_err(|e| ApiError::BadRequest(format!("load_metrics: {e}")))?;
    let Some(discovery) = &state.discovery else {
        return Err(ApiError::Conflict(format!(
            "no registered instance named {:?}: discovery is not configured",
            hb.name
        )));
    };
    // Queued for discovery's next pass when its published view knows the sender; otherwise
    // answered by discovery itself (`discovery/beats.rs`).
    if !state.beats.offer(&hb.name, hb.incarnation(), load) {
        let incarnation_id = hb.incarnation().map(str::to_string);
        let msg = Heartbeat { name: hb.name.into_owned(), incarnation_id, load };
        discovery.send(msg).await??;
    }
    Ok(HttpResponse::Ok().content_type(ContentType::json()).body(HEARTBEAT_OK))
}

async fn instances(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let mut body = match &state.discovery {
        Some(d) => serde_json::to_value(d.send(GetInstances).await?).unwrap_or_default(),
        None => serde_json::json!({
            "etcd_connected": false, "etcd_error": null, "etcd_listings": 0, "instances": []
        }),
    };
    // Every instance the front door forwarded to, listed or not (the demo lists none).
    body["cache_audit"] = serde_json::json!(state.front.metrics.audit.reports());
    Ok(HttpResponse::Ok().json(body))
}
