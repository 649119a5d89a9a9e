//! End-to-end harness: a running kvdir service (real HTTP on 127.0.0.1, port 0) subscribed to
//! simulated engines (real ZeroMQ on loopback), and what a user reads from it.

use std::net::SocketAddr;

use kvdir::car::Routed;
use kvdir::config::{parse_config_file, Flags};
use kvdir::query::{QueryResponse, StreamMatch};
use kvdir_service::Service;
use kvdir_sim::{EngineConfig, Registration, RegistrationOptions, SimEngine, SimError};
use kvdir_testkit::eventually;
use kvdir_testkit::http::Response;
use serde_json::{json, Value};

/// Block size used by the end-to-end tests.
pub const B: u32 = 16;

/// An engine on ephemeral loopback ports.
pub fn engine(name: &str, dp_size: u32, host_blocks: usize) -> SimEngine {
    SimEngine::start(EngineConfig {
        name: name.into(),
        dp_size,
        block_size: B,
        device_capacity_blocks: 256,
        host_capacity_blocks: host_blocks,
        ..EngineConfig::default()
    })
    .expect("the simulated engine starts")
}

/// The `streams` entries for every rank of `engine`.
pub fn streams_of(engine: &SimEngine) -> Vec<Value> {
    let c = engine.config();
    engine
        .endpoints()
        .iter()
        .enumerate()
        .map(|(r, ep)| {
            json!({"instance_name": c.name, "dp_rank": r, "block_size": c.block_size,
                   "endpoint": ep.event, "replay_endpoint": ep.replay, "topic": c.topic,
                   "replay": c.dialect.replay().as_str()})
        })
        .collect()
}

/// Starts kvdir on 127.0.0.1 with a config file built from `streams` plus `extra` limits.
pub fn service(streams: Vec<Value>, extra: Value) -> Service {
    service_with(streams, extra, Flags::default())
}

/// Like [`service`] with explicit flags (the port is always 0 and the host 127.0.0.1).
pub fn service_with(streams: Vec<Value>, extra: Value, flags: Flags) -> Service {
    let mut config = json!({ "streams": streams });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let directory = parse_config_file(&config.to_string()).expect("valid test config");
    // The registry always follows etcd. A test that uses it gives a namespace (as every etcd
    // test does, for isolation); otherwise point it at a port where nothing listens, so a
    // developer's own etcd on 2379 cannot leak instances into the test.
    let etcd_addr =
        if flags.etcd_namespace.is_empty() { NO_ETCD.to_string() } else { flags.etcd_addr.clone() };
    let flags = Flags { http_server_port: 0, server_host: "127.0.0.1".into(), etcd_addr, ..flags };
    Service::start(flags, Some(directory)).expect("kvdir starts")
}

/// An etcd address where nothing listens (port 1 needs root to bind and nothing uses it).
pub const NO_ETCD: &str = "127.0.0.1:1";

/// Starts kvdir with discovery (block size [`B`], topic `xllm-kv`, 100 ms refresh) on `etcd`
/// under `namespace`, plus `extra` top-level config keys and `flags` (port 0 and the etcd
/// settings are always set here).
pub fn discovery_service(etcd: &str, namespace: &str, extra: Value, flags: Flags) -> Service {
    let mut config = json!({"discovery": {"enabled": true, "block_size": B, "topic": "xllm-kv",
        "refresh_interval_ms": 100}});
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let directory = parse_config_file(&config.to_string()).expect("valid discovery config");
    let flags = Flags {
        http_server_port: 0,
        etcd_addr: etcd.to_string(),
        etcd_namespace: namespace.to_string(),
        ..flags
    };
    Service::start(flags, Some(directory)).expect("kvdir starts")
}

/// One request on its own connection; an empty `body` sends none. Panics on a transport error.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let text = std::str::from_utf8(body).expect("request bodies are JSON text");
    let body = (!body.is_empty()).then_some(text);
    kvdir_testkit::http::request(&addr.to_string(), method, path, headers, body)
}

/// POSTs a query listing every stream (`"list": "all"`, whatever the fleet's size) and returns
/// the parsed response.
pub fn query(svc: &Service, tokens: &[i32]) -> QueryResponse {
    let body = json!({ "token_ids": tokens, "list": "all" }).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
    assert_eq!(r.status, 200, "query failed: {}", r.body);
    serde_json::from_str(&r.body).expect("a query response")
}

/// POSTs a route request; the decision, or the status and body of a refusal.
pub fn route(svc: &Service, tokens: &[i32]) -> Result<Routed, String> {
    let body = json!({ "token_ids": tokens }).to_string();
    let r = http(svc.http_addr(), "POST", "/v1/internal/route", &[], body.as_bytes());
    if r.status != 200 {
        return Err(format!("{}: {}", r.status, r.body));
    }
    serde_json::from_str(&r.body).map_err(|e| e.to_string())
}

/// The entry for `instance`/`rank` in a query response, if it has one.
pub fn find_entry<'a>(r: &'a QueryResponse, instance: &str, rank: u32) -> Option<&'a StreamMatch> {
    r.matches.iter().find(|m| m.instance_name == instance && m.dp_rank == rank)
}

/// The entry for `instance`/`rank` in a query response; panics without one.
pub fn entry<'a>(r: &'a QueryResponse, instance: &str, rank: u32) -> &'a StreamMatch {
    find_entry(r, instance, rank)
        .unwrap_or_else(|| panic!("no entry for {instance}/{rank} in {r:?}"))
}

/// The streams report of kvdir.
pub fn report(svc: &Service) -> Value {
    http(svc.http_addr(), "GET", "/v1/internal/streams", &[], b"").json()
}

/// `(device_hit_tokens, host_only_hit_tokens)` kvdir reports, if synchronized.
pub fn hits(
    svc: &Service,
    instance: &str,
    rank: u32,
    tokens: &[i32],
) -> Result<(u64, u64), String> {
    let r = query(svc, tokens);
    let m = find_entry(&r, instance, rank)
        .ok_or_else(|| format!("no stream {instance}/{rank} (yet)"))?;
    if !m.synchronized {
        return Err(format!("unsynchronized: {:?}", m.error));
    }
    Ok((m.device_hit_tokens, m.host_only_hit_tokens))
}

/// Waits until kvdir's answer for `tokens` equals the engine's own ground truth.
pub fn agrees(svc: &Service, eng: &SimEngine, rank: u32, tokens: &[i32]) -> (u64, u64) {
    let name = eng.config().name.clone();
    eventually("kvdir to agree with the engine", || {
        let truth = eng.resident(rank, tokens).map_err(|e| e.to_string())?;
        let got = hits(svc, &name, rank, tokens)?;
        if got == truth {
            Ok(got)
        } else {
            Err(format!("kvdir {got:?}, engine {truth:?}"))
        }
    })
}

/// `n` blocks of distinct tokens starting at `first`.
pub fn prompt(first: i32, n: usize) -> Vec<i32> {
    (first..).take(n * B as usize).collect()
}

static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// An HTTP port whose derived event and replay ranges (dp ranks) are free; each call starts past
/// the last port handed out in this test binary, so tests running in parallel never share one.
pub fn free_http_port(dp: u16) -> u16 {
    let base = 21_000 + (std::process::id() % 40) as u16 * 100;
    loop {
        let p = base + NEXT_PORT.fetch_add(dp.max(1) + 1, std::sync::atomic::Ordering::Relaxed);
        assert!(p < 35_000, "ran out of test ports");
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(p) && (0..dp).all(|r| free(p + 10_000 + r) && free(p + 30_000 + r)) {
            return p;
        }
    }
}

/// An engine serving HTTP on `http_port` (for discovery: its event and snapshot ports derive
/// from it) with `dp` ranks of [`B`]-token blocks.
pub fn engine_on(http_port: u16, dp: u32) -> SimEngine {
    SimEngine::start(engine_config(http_port, dp)).expect("engine starts")
}

/// [`engine_on`] a port of [`free_http_port`] (see [`engine_on_free_port`]).
pub fn free_engine(dp: u32) -> SimEngine {
    engine_on_free_port(dp, |http_port| engine_config(http_port, dp))
}

fn engine_config(http_port: u16, dp: u32) -> EngineConfig {
    EngineConfig { http_port, dp_size: dp, block_size: B, ..EngineConfig::default() }
}

/// The engine `config(port)` describes, on a port of [`free_http_port`] for `dp` ranks. The
/// derived event and snapshot ports lie in the kernel's ephemeral range, so an outgoing
/// connection of a test running in parallel can take one between the probe and the bind: then
/// it takes the next free port (at most 5 times).
pub fn engine_on_free_port(dp: u32, config: impl Fn(u16) -> EngineConfig) -> SimEngine {
    for _ in 0..5 {
        match SimEngine::start(config(free_http_port(dp as u16))) {
            Err(SimError::Bind { .. }) => continue,
            started => return started.expect("engine starts"),
        }
    }
    panic!("five probed blocks of ports were taken before the engine bound them")
}

/// An engine with `dp` ranks (see [`engine_on`]) registered in `etcd` under `namespace` as a
/// DEFAULT instance that writes LOADMETRICS.
pub fn registered_engine(etcd: &str, namespace: &str, dp: u32) -> (SimEngine, Registration) {
    let eng = free_engine(dp);
    let opts = RegistrationOptions {
        etcd: etcd.into(),
        namespace: namespace.into(),
        kind: 0,
        write_loadmetrics: true,
        ..RegistrationOptions::default()
    };
    let reg = Registration::start(&eng, opts).unwrap();
    (eng, reg)
}

/// Writes a registry key directly through etcd's JSON gateway (no lease).
pub fn etcd_put(etcd: &kvdir_testkit::etcd::EtcdServer, key: &str, value: &Value) {
    let addr = etcd.endpoint.trim_start_matches("http://").parse().unwrap();
    let b64 =
        |bytes: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes);
    let body = json!({"key": b64(key.as_bytes()), "value": b64(value.to_string().as_bytes())});
    let r = http(addr, "POST", "/v3/kv/put", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "etcd put: {}", r.body);
}
