//! [`EngineServer`]: the engine's business HTTP port on 127.0.0.1, served by actix-web on a
//! thread of its own (its own `actix_rt::System`, one worker): `GET /health` always, and the
//! OpenAI routes (503 without a text model). In the vLLM dialect `/health` answers an empty
//! 200 as vLLM does, and `GET /metrics` serves Prometheus text (`metrics`); the xLLM dialect
//! has no `/metrics`. Dropping the server stops it and returns once the port is free again.

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use futures_util::StreamExt;
use serde_json::json;
use tracing::debug;

use super::generate::{self, Reply};
use super::metrics::{self, RankGauges};
use super::request::{self, Kind};
use super::{ApiError, OpenAiConfig, RequestGuard, RequestLoad};
use crate::engine::Ranks;
use crate::process::ProcessStart;
use crate::{Dialect, EngineConfig, SimError};

/// How long `drop` waits for the listening socket to close.
const FREE_PORT_DEADLINE: Duration = Duration::from_secs(5);
/// The response header naming the DP rank that served a request.
pub const DP_RANK_HEADER: &str = "x-sim-dp-rank";
/// The response header with the request's cached prompt tokens.
pub const CACHED_TOKENS_HEADER: &str = "x-sim-cached-tokens";

/// What the HTTP server needs from its engine.
pub(crate) struct ServerState {
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) ranks: Arc<Ranks>,
    pub(crate) load: Arc<RequestLoad>,
    pub(crate) started: Arc<ProcessStart>,
}

/// The state handlers see: the engine's, plus the answer text of its model.
struct Served {
    engine: ServerState,
    pieces: Arc<Vec<String>>,
    /// One lock per DP rank, held through a prefill when `serial_prefill` (tokio's mutex is
    /// fair: first come, first served).
    lanes: Vec<tokio::sync::Mutex<()>>,
    /// Per DP rank: prefills, their uncached tokens and the microseconds they took (vLLM's
    /// prefill histograms' counts and sums).
    prefilled: Vec<[AtomicU64; 3]>,
    /// The vLLM balancer's scan start, moved on every request it places.
    balance_start: AtomicU64,
}

impl Served {
    fn openai(&self) -> Result<&OpenAiConfig, ApiError> {
        let engine = || self.engine.config.instance_name();
        self.engine.config.openai.as_ref().ok_or_else(|| ApiError::NoModel { engine: engine() })
    }
}

/// The running server; stops on drop.
pub(crate) struct EngineServer {
    port: u16,
    handle: Option<ServerHandle>,
    thread: Option<JoinHandle<()>>,
}

impl EngineServer {
    /// Binds 127.0.0.1:`http_port` and serves until dropped.
    pub(crate) fn start(engine: ServerState) -> Result<EngineServer, SimError> {
        let port = engine.config.http_port;
        let http_err = |source| SimError::Http { port, source };
        let listener = TcpListener::bind(("127.0.0.1", port)).map_err(http_err)?;
        let pieces = engine.config.openai.as_ref().map(|o| generate::answer_pieces(&o.model));
        let lanes = (0..engine.ranks.dp_size()).map(|_| tokio::sync::Mutex::new(())).collect();
        let prefilled = (0..engine.ranks.dp_size()).map(|_| Default::default()).collect();
        let pieces = Arc::new(pieces.unwrap_or_default());
        let balance_start = AtomicU64::new(0);
        let served = Served { engine, pieces, lanes, prefilled, balance_start };
        let name = format!("sim-{}-http", served.engine.config.name);
        let (ready, started) = mpsc::sync_channel(1);
        let thread = thread::Builder::new()
            .name(name)
            .spawn(move || run(listener, served, &ready))
            .map_err(http_err)?;
        let stopped = || io::Error::other("the HTTP thread stopped while starting");
        let handle = started.recv().map_err(|_| http_err(stopped()))?.map_err(http_err)?;
        Ok(EngineServer { port, handle: Some(handle), thread: Some(thread) })
    }
}

impl Drop for EngineServer {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // `stop` sends the command at once; its future only reports completion, which
            // joining the thread waits for.
            drop(handle.stop(false));
        }
        if let Some(thread) = self.thread.take() {
            // A panicked server thread has nothing left to clean up.
            let _ = thread.join();
        }
        // actix closes the listener on its accept thread, which nobody joins: wait for it.
        let deadline = Instant::now() + FREE_PORT_DEADLINE;
        while TcpListener::bind(("127.0.0.1", self.port)).is_err() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The server thread: runs the actix system until the server is stopped.
fn run(listener: TcpListener, served: Served, ready: &mpsc::SyncSender<io::Result<ServerHandle>>) {
    let system = actix_rt::System::new();
    system.block_on(async move {
        let data = web::Data::new(served);
        let server = HttpServer::new(move || {
            let route = |path: &str, method: actix_web::Route| {
                web::resource(path).route(method).default_service(web::to(not_found))
            };
            App::new()
                .app_data(data.clone())
                .service(route("/health", web::get().to(health)))
                .service(route("/metrics", web::get().to(prometheus)))
                .service(route("/v1/models", web::get().to(models)))
                .service(route("/tokenize", web::post().to(tokenize)))
                .service(route("/v1/chat/completions", web::post().to(chat)))
                .service(route("/v1/completions", web::post().to(completions)))
                .default_service(web::to(not_found))
        })
        .workers(1)
        .worker_max_blocking_threads(4)
        .disable_signals()
        .on_connect(no_delay)
        .shutdown_timeout(0)
        .listen(listener);
        let server = match server {
            Ok(server) => server.run(),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(server.handle()));
        if let Err(e) = server.await {
            debug!(error = %e, "engine HTTP server failed");
        }
    });
}

async fn health(served: web::Data<Served>) -> HttpResponse {
    match served.engine.config.dialect {
        Dialect::Vllm => HttpResponse::Ok().finish(),
        _ => HttpResponse::Ok().content_type("application/json").body(r#"{"status":"ok"}"#),
    }
}

/// vLLM's `/metrics`; 404 in the xLLM dialect.
async fn prometheus(request: HttpRequest, served: web::Data<Served>) -> HttpResponse {
    if served.engine.config.dialect != Dialect::Vllm {
        return not_found(request).await;
    }
    let data = served.clone();
    let text = blocking(move || {
        let engine = &data.engine;
        let capacity = engine.config.device_capacity_blocks.max(1) as f64;
        let mut gauges = Vec::new();
        for rank in 0..engine.ranks.dp_size() {
            let (device, _) = engine.ranks.call(rank, |r| Ok(r.counts())).map_err(unavailable)?;
            let (waiting, running) = engine.load.on_rank_by_phase(rank);
            let kv_cache_usage = (device as f64 / capacity).clamp(0.0, 1.0);
            let [count, tokens, micros] = &data.prefilled[rank as usize];
            let prefills = count.load(Ordering::Relaxed);
            let prefill_tokens = tokens.load(Ordering::Relaxed) as f64;
            let prefill_seconds = micros.load(Ordering::Relaxed) as f64 / 1e6;
            let prefill = (prefills, prefill_tokens, prefill_seconds);
            gauges.push(RankGauges { waiting, running, kv_cache_usage, prefill });
        }
        let model = engine.config.openai.as_ref().map(|o| o.served_model_name.as_str());
        let model = model.unwrap_or(&engine.config.name);
        let mut text = metrics::render(engine.started.seconds(), model, &gauges);
        // vLLM's cache settings as an info gauge: kvdir compares the block size with its own.
        let block_size = engine.config.block_size;
        text.push_str(&format!("vllm:cache_config_info{{block_size=\"{block_size}\"}} 1.0\n"));
        Ok(text)
    })
    .await;
    match text {
        Ok(text) => HttpResponse::Ok().content_type(metrics::CONTENT_TYPE).body(text),
        Err(e) => actix_web::ResponseError::error_response(&e),
    }
}

async fn not_found(request: HttpRequest) -> HttpResponse {
    let (method, path) = (request.method().to_string(), request.path().to_string());
    actix_web::ResponseError::error_response(&ApiError::NotFound { method, path })
}

/// `POST /tokenize`: `{"tokens": [...], "count": n}`, as vLLM and SGLang answer.
async fn tokenize(
    request: HttpRequest,
    payload: web::Payload,
    served: web::Data<Served>,
) -> Result<HttpResponse, ApiError> {
    let openai = served.openai()?.clone();
    let body = read_body(&request, payload, openai.max_request_bytes).await?;
    let tokens = blocking(move || request::tokenize(&body, &openai)).await?;
    Ok(HttpResponse::Ok().json(json!({"tokens": tokens, "count": tokens.len()})))
}

async fn models(served: web::Data<Served>) -> Result<HttpResponse, ApiError> {
    let openai = served.openai()?;
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [{
            "id": openai.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "kvdir-sim",
        }],
    })))
}

async fn chat(
    request: HttpRequest,
    payload: web::Payload,
    served: web::Data<Served>,
) -> Result<HttpResponse, ApiError> {
    serve(Kind::Chat, &request, payload, served).await
}

async fn completions(
    request: HttpRequest,
    payload: web::Payload,
    served: web::Data<Served>,
) -> Result<HttpResponse, ApiError> {
    serve(Kind::Completion, &request, payload, served).await
}

/// Reads the body (at most `limit` bytes), tokenizes it, picks a rank, prefills, and answers.
async fn serve(
    kind: Kind,
    request: &HttpRequest,
    payload: web::Payload,
    served: web::Data<Served>,
) -> Result<HttpResponse, ApiError> {
    let openai = served.openai()?.clone();
    let body = read_body(request, payload, openai.max_request_bytes).await?;
    let mut guard = RequestGuard::new(Arc::clone(&served.engine.load));
    let (data, config) = (served.clone(), openai.clone());
    let named = named_rank(request, &served.engine)?;
    let (parsed, rank, cached, mut guard) = blocking(move || {
        let salted = data.engine.config.dialect == Dialect::Vllm;
        let parsed = request::parse(kind, &body, &config, salted)?;
        let (rank, cached) = place(&data, named, &parsed.tokens, parsed.salt.as_deref())?;
        let cached = data.engine.config.reused_tokens(parsed.tokens.len(), cached);
        // Counted on the rank at once, so the next request's choice sees it.
        guard.assign(rank);
        Ok((parsed, rank, cached, guard))
    })
    .await?;
    let prompt_tokens = parsed.tokens.len() as u64;
    prefill(&served, &openai, rank, (parsed.tokens, parsed.salt), cached).await?;
    guard.start_decode();
    let decode = Duration::from_micros(openai.decode_us_per_token);
    let pieces = Arc::clone(&served.pieces);
    let model = &openai.served_model_name;
    let reported = openai.cached_report.report(cached);
    let reply = Reply::new(kind, parsed.params, model, prompt_tokens, reported, decode, pieces);
    let mut response = HttpResponse::Ok();
    response
        .insert_header((DP_RANK_HEADER, rank.to_string()))
        .insert_header((CACHED_TOKENS_HEADER, cached.to_string()));
    if reply.params.stream {
        response
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"));
        return Ok(response.streaming(generate::sse(reply, guard)));
    }
    let body = reply.complete().await;
    drop(guard);
    Ok(response.json(body))
}

/// The rank a vLLM request names in `X-data-parallel-rank`, as vLLM reads it: a value that is
/// not an integer is ignored; one outside `0..dp_size` is refused. The xLLM dialect reads none.
fn named_rank(request: &HttpRequest, engine: &ServerState) -> Result<Option<u32>, ApiError> {
    if engine.config.dialect != Dialect::Vllm {
        return Ok(None);
    }
    let value = request.headers().get(generate::RANK_HEADER).and_then(|v| v.to_str().ok());
    let Some(rank) = value.and_then(|v| v.trim().parse::<i64>().ok()) else { return Ok(None) };
    let dp_size = engine.ranks.dp_size();
    match u32::try_from(rank).ok().filter(|&r| r < dp_size) {
        Some(r) => Ok(Some(r)),
        None => Err(ApiError::BadField {
            field: "X-data-parallel-rank",
            problem: format!(
                "is {rank}, out of range 0..{dp_size}; name one of this engine's ranks"
            ),
        }),
    }
}

/// The rank that serves a request and its cached prefix: the named rank, else vLLM's balancer
/// (vLLM dialect) or the longest cached prefix (xLLM dialect).
fn place(
    data: &Served,
    named: Option<u32>,
    tokens: &[i32],
    salt: Option<&str>,
) -> Result<(u32, u64), ApiError> {
    let (ranks, load) = (&data.engine.ranks, &data.engine.load);
    if data.engine.config.dialect != Dialect::Vllm {
        return generate::choose_rank(ranks, load, tokens, salt).map_err(unavailable);
    }
    let rank = named.unwrap_or_else(|| {
        let start = data.balance_start.fetch_add(1, Ordering::Relaxed);
        generate::balance_rank(load, ranks.dp_size(), start)
    });
    Ok((rank, generate::cached_on(ranks, rank, tokens, salt).map_err(unavailable)?))
}

/// Sleeps the prefill cost of the uncached tokens, then puts the prompt (tokens and
/// `cache_salt`) in `rank`'s cache, which publishes its KV events.
async fn prefill(
    served: &web::Data<Served>,
    openai: &OpenAiConfig,
    rank: u32,
    (tokens, salt): (Vec<i32>, Option<String>),
    cached: u64,
) -> Result<(), ApiError> {
    let uncached = (tokens.len() as u64).saturating_sub(cached);
    let cost = Duration::from_micros(openai.prefill_us_per_token.saturating_mul(uncached));
    let lane = served.lanes.get(rank as usize).filter(|_| openai.serial_prefill);
    let _turn = match lane {
        Some(lane) => Some(lane.lock().await),
        None => None,
    };
    let started = Instant::now();
    tokio::time::sleep(cost).await;
    if let Some([count, tokens, micros]) = served.prefilled.get(rank as usize) {
        count.fetch_add(1, Ordering::Relaxed);
        tokens.fetch_add(uncached, Ordering::Relaxed);
        micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
    let data = served.clone();
    let process =
        move || data.engine.ranks.call(rank, move |r| r.process(&tokens, salt.as_deref()));
    blocking(move || process().map(|_| ()).map_err(unavailable)).await
}

/// Runs `f` on the blocking pool (tokenizing and rank calls are synchronous).
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    web::block(f).await.map_err(|e| ApiError::Unavailable(format!("blocking pool: {e}")))?
}

fn unavailable(e: SimError) -> ApiError {
    ApiError::Unavailable(e.to_string())
}

/// The request body, refused with 413 as soon as it is known to exceed `limit`.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadJson(format!("reading the body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Streams token by token as engines do (their HTTP servers set TCP_NODELAY): without it, a
/// token written after the response head waits for the client's delayed ACK.
fn no_delay(conn: &dyn std::any::Any, _: &mut actix_web::dev::Extensions) {
    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        let _ = tcp.set_nodelay(true);
    }
}
