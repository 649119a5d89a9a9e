//! The KV indexer API of Mooncake Conductor (RFC #1403) on kvdir's HTTP port:
//! `POST /register`, `POST /unregister`, `POST /query` and `POST /query_by_hash`.
//!
//! Same rules as the internal routes: `X-Internal-Token` when configured, bodies up to
//! `--max_request_bytes`, errors through [`ApiError`]. A registered stream is a stream like any
//! other (same checks, same index, listed in `/v1/internal/streams` with `source: register`);
//! `/unregister` stops only streams started by `/register`. The bodies and the answer's shape
//! are in `kvdir::indexer_api`.
//!
//! A `/register` body with a `url` is a whole engine instead, in the config file's `engines`
//! form (`kvdir::config::parse_engine_json_with`): kvdir polls it, gives it CAR credit once its
//! process is known, and forwards to it. `/unregister` with its name removes it.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use kvdir::config::parse_engine_json_with;
use kvdir::indexer_api::{parse_register, parse_unregister, rfc_answer};
use serde::Serialize;

use super::metrics::Endpoint;
use super::{authorize, authorized_body, observed, read_tokens, ApiError, AppState};
use crate::directory::StreamHit;
use crate::discovery::{ListEngine, UnlistEngine};
use crate::stream::StreamKey;
use crate::stream::StreamSource;

/// Registers the indexer routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/register", web::post().to(register))
        .route("/unregister", web::post().to(unregister))
        .route("/query", web::post().to(query))
        .route("/query_by_hash", web::post().to(query_by_hash));
}

async fn register(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = authorized_body(&req, payload, &state).await?;
    if let Some(engine) = engine_body(&body) {
        return register_engine(&state, engine).await;
    }
    let reg = parse_register(&body)?;
    let (instance_id, dp_rank) = (reg.spec.instance_name.clone(), reg.spec.dp_rank);
    // Duplicates, overlaps and a full set are conflicts with the running streams.
    state.set.register(reg)?;
    tracing::info!(instance = %instance_id, dp = dp_rank, "stream registered");
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "status": "ok", "instance_id": instance_id, "dp_rank": dp_rank, "source": "register"
    })))
}

/// The body as JSON when it describes an engine (it has a `url`).
fn engine_body(body: &[u8]) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("url").is_some().then_some(v)
}

async fn register_engine(
    state: &AppState,
    body: serde_json::Value,
) -> Result<HttpResponse, ApiError> {
    let bind = state.set.bind().map(|b| b.config());
    let spec =
        parse_engine_json_with(&body, bind).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let Some(discovery) = &state.discovery else {
        return Err(ApiError::Conflict("this kvdir runs no instance registry (demo)".into()));
    };
    let (name, dp_size) = (spec.name.clone(), spec.dp_size());
    discovery.send(ListEngine(spec)).await?.map_err(ApiError::Conflict)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "status": "ok", "instance_id": name, "dp_size": dp_size, "source": "register"
    })))
}

#[derive(Serialize)]
struct Removed {
    instance_id: String,
    dp_rank: u32,
    endpoint: String,
}

async fn unregister(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body = authorized_body(&req, payload, &state).await?;
    let u = parse_unregister(&body)?;
    let keys: Vec<StreamKey> = state
        .set
        .keys_from(StreamSource::Register)
        .into_iter()
        .filter(|k| k.instance_name == u.instance_id && u.dp_rank.is_none_or(|r| r == k.dp_rank))
        .collect();
    if let (true, Some(d)) = (keys.is_empty() && u.dp_rank.is_none(), &state.discovery) {
        if let Ok(events) = d.send(UnlistEngine(u.instance_id.clone())).await? {
            let removed: Vec<Removed> = (0u32..)
                .zip(events)
                .map(|(dp_rank, endpoint)| Removed {
                    instance_id: u.instance_id.clone(),
                    dp_rank,
                    endpoint: shown(&state, endpoint, dp_rank),
                })
                .collect();
            return Ok(HttpResponse::Ok().json(serde_json::json!({ "removed": removed })));
        }
    }
    if keys.is_empty() {
        let rank = u.dp_rank.map(|r| format!(" dp_rank {r}")).unwrap_or_default();
        return Err(ApiError::UnknownStream(format!(
            "no stream started by /register for instance_id {:?}{rank}; /unregister stops only \
             those (GET /v1/internal/streams lists every stream with its source)",
            u.instance_id
        )));
    }
    let mut removed = Vec::with_capacity(keys.len());
    for key in keys {
        let endpoint = state.set.get(&key).map(|r| r.spec.endpoint).unwrap_or_default();
        state.set.stop(&key).await;
        tracing::info!(instance = %key.instance_name, dp = key.dp_rank, "stream unregistered");
        removed.push(Removed { instance_id: key.instance_name, dp_rank: key.dp_rank, endpoint });
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({ "removed": removed })))
}

async fn query(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let result = async {
        let (tokens, scope) = read_tokens(&req, payload, &state).await?;
        let hits = state.directory.read_in(&tokens, &scope);
        let matches: Vec<_> = hits.iter().map(StreamHit::matched).collect();
        Ok(rfc_answer(hits.iter().zip(&matches).map(|(h, m)| (h.label.tenant.as_str(), m))))
    };
    let answer = observed(&state, Endpoint::Query, started, result.await)?;
    Ok(HttpResponse::Ok().json(answer))
}

async fn query_by_hash(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    Err(ApiError::NotImplemented(
        "query_by_hash is not implemented: kvdir keys blocks by their content (XXH3-128 chained \
         over token ids, with the adapter and salt in the seed), not by the RFC's rolling \
         XXH3-64 block hashes, so it cannot look up a hash it never computed; send token_ids to \
         POST /query instead"
            .into(),
    ))
}

/// An engine's event endpoint as operators know it: a bound one as its rank's bound port.
fn shown(state: &AppState, endpoint: String, dp_rank: u32) -> String {
    match state.set.bind().filter(|_| kvdir::config::is_bound(&endpoint)) {
        Some(b) => format!("bind {}", b.config().rank_endpoint(dp_rank)),
        None => endpoint,
    }
}
