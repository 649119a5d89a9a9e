//! Engines listed by address, end to end and without etcd: the `kvdir` binary runs with
//! `--etcd_addr=` and a config that lists one vLLM-dialect engine. The engine is two real
//! servers: a small HTTP server (`common::engine_http`) answering `/health`, `/metrics` (vLLM's gauge
//! names and `process_start_time_seconds`, values set by the test) and `/v1/completions`, and a
//! simulated engine in vLLM's dialect publishing its KV events over ZeroMQ on loopback and
//! answering history replays.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use kvdir_sim::{Dialect, EngineConfig, SimEngine};
use serde_json::{json, Value};

fn get(addr: &str, path: &str) -> Value {
    let r = request(addr, "GET", path, None, None);
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r.json()
}

/// The instance named `name` in `/v1/internal/instances`.
fn instance(addr: &str, name: &str) -> Option<Value> {
    let all = get(addr, "/v1/internal/instances");
    all["instances"].as_array().unwrap().iter().find(|i| i["name"] == name).cloned()
}

/// The stream of `name` rank 0 in `/v1/internal/streams`.
fn stream(addr: &str, name: &str) -> Option<Value> {
    let all = get(addr, "/v1/internal/streams");
    let list = all.as_array().or_else(|| all["streams"].as_array()).unwrap().clone();
    list.into_iter().find(|s| s["instance_name"] == name)
}

/// The simulated engine's event side, in vLLM's dialect: live batches and a history replay.
fn vllm_events(name: &str) -> SimEngine {
    SimEngine::start(EngineConfig {
        name: name.into(),
        block_size: B,
        device_capacity_blocks: 256,
        dialect: Dialect::Vllm,
        ..EngineConfig::default()
    })
    .expect("the simulated engine starts")
}

/// The route decision's candidate `name` for `tokens`, once it gets credit.
fn credited(addr: &str, name: &str, tokens: &[i32]) -> Result<Value, String> {
    let body = json!({ "token_ids": tokens }).to_string();
    let r = request(addr, "POST", "/v1/internal/route", None, Some(&body));
    let routed = r.json();
    let c = routed["candidates"].as_array().and_then(|c| c.iter().find(|c| c["name"] == name));
    match c {
        Some(c) if c["kv_hit_ratio"].as_f64() > Some(0.0) => Ok(c.clone()),
        _ => Err(r.body),
    }
}

/// The candidate's TTFT terms once its rate comes from `source`.
fn reported_rate(addr: &str, tokens: &[i32], source: &str) -> Result<Value, String> {
    let c = credited(addr, "vllm-a", tokens)?;
    match c["ttft"]["rate_source"] == source {
        true => Ok(c),
        false => Err(c.to_string()),
    }
}

fn write_config(dir: &Path, http: u16, events: &str, replay: &str, topic: &str) -> String {
    let config = json!({"engines": [{
        "name": "vllm-a", "url": format!("http://127.0.0.1:{http}/v1"), "dialect": "vllm",
        "events": events, "replay": replay, "block_size": B, "model": "kvdir-demo",
        "topic": topic
    }], "engine_poll_interval_ms": 100});
    let path = dir.join("engines.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path.display().to_string()
}

#[test]
fn a_listed_engine_gets_identity_load_credit_and_requests_without_etcd() {
    let http = TestEngine::start();
    let events = vllm_events("vllm-a");
    let ep = &events.endpoints()[0];
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), http.port, &ep.event, &ep.replay, &events.config().topic);
    let model = tmp.path().join("kvdir-demo");
    kvdir_text::demo::write_model(&model).unwrap();
    let kv = spawn(
        &[
            "--http_server_port=0",
            "--etcd_addr=",
            &format!("--kv_events_config_file={config}"),
            &format!("--tokenizer_path={}", model.display()),
        ],
        "kvdir listening on http://",
    );
    let addr = &kv.addr;

    // Identity and load come from /metrics; no etcd at all.
    let first = "process_start_time_seconds=1764598123.25";
    let i = eventually("the engine's identity", || {
        let i = instance(addr, "vllm-a").ok_or("not listed")?;
        (i["incarnation_id"] == first).then_some(i.clone()).ok_or(i.to_string())
    });
    assert_eq!(i["state"], "ACTIVE");
    assert_eq!(i["backend"], "vllm");
    assert_eq!(i["waiting_requests_num"], 5, "waiting 3 + running 2: {i}");
    assert_eq!(i["gpu_cache_usage_perc"], 0.25);
    assert_eq!(i["engine"]["url"], format!("http://127.0.0.1:{}", http.port));
    assert_eq!(i["engine"]["num_requests_running"], 2);
    assert_eq!(get(addr, "/v1/internal/instances")["etcd_connected"], false);

    // Its stream runs for that process, and a cached prompt gets CAR credit.
    let s = eventually("the engine's stream", || stream(addr, "vllm-a").ok_or("none".into()));
    assert_eq!((s["source"].as_str(), s["process"].as_str()), (Some("engine"), Some(first)));
    let tokens = prompt(7, 4 * B as usize);
    events.process(0, &tokens).unwrap();
    let c = eventually("credit on the listed engine", || credited(addr, "vllm-a", &tokens));
    assert_eq!(c["dp_hits"][0]["identity_matches"], true, "{c}");
    assert_eq!(c["ttft"]["rate_source"], "configured", "no prefill sums yet: {c}");

    // The prefill sums of two polls give the engine's reported prefill rate: 2,000 more
    // tokens in 0.5 more seconds.
    http.set(|s| s.prefill = Some((1000.0, 1.0)));
    let polls = || instance(addr, "vllm-a").and_then(|i| i["engine"]["polls"].as_u64());
    let after = polls().expect("polls") + 1;
    eventually("a poll of the first sums", || {
        polls().filter(|p| *p > after).ok_or("not yet".to_string())
    });
    http.set(|s| s.prefill = Some((3000.0, 1.5)));
    let c = eventually("a reported rate", || reported_rate(addr, &tokens, "reported"));
    assert_eq!(c["ttft"]["prefill_tokens_per_s"], 4000.0, "{c}");
    let i = instance(addr, "vllm-a").unwrap();
    assert_eq!(i["engine"]["prefill_tokens_per_s"], 4000.0, "{i}");

    // The front door forwards to the engine's URL (its name is no address).
    let body = json!({"model": "kvdir-demo", "prompt": "hello there"}).to_string();
    let r = request(addr, "POST", "/v1/completions", None, Some(&body));
    assert_eq!((r.status, r.json()["served_by"].as_str()), (200, Some("test-engine")), "{r:?}");
    assert!(r.head.to_ascii_lowercase().contains("x-kvdir-instance: vllm-a"), "{}", r.head);

    // Another process start time is another process: the stream starts again for it, and
    // credit comes back once it is synchronized with the (unchanged) publisher.
    http.set(|s| s.start_time = Some(1_764_599_000.5));
    let second = "process_start_time_seconds=1764599000.5";
    eventually("the stream restarted for the new process", || {
        let s = stream(addr, "vllm-a").ok_or("none")?;
        (s["process"] == second).then_some(()).ok_or(s.to_string())
    });
    let c = eventually("credit for the new process", || credited(addr, "vllm-a", &tokens));
    assert_eq!(c["dp_hits"][0]["identity_matches"], true, "{c}");
    assert_eq!(c["ttft"]["rate_source"], "configured", "the new process's rate is unknown: {c}");

    // An unhealthy engine is not routed to; a healthy one again is.
    http.set(|s| s.healthy = false);
    eventually("SUSPECT while /health fails", || {
        let i = instance(addr, "vllm-a").unwrap();
        (i["state"] == "SUSPECT").then_some(()).ok_or(i.to_string())
    });
    let body = json!({ "token_ids": tokens }).to_string();
    let r = request(addr, "POST", "/v1/internal/route", None, Some(&body));
    assert_eq!(r.status, 503, "{}", r.body);
    http.set(|s| s.healthy = true);
    eventually("ACTIVE again", || credited(addr, "vllm-a", &tokens));
}

#[test]
fn an_engine_registered_over_http_is_listed_and_unlisted() {
    let http = TestEngine::start();
    http.set(|s| s.start_time = None);
    let kv = spawn(&["--http_server_port=0", "--etcd_addr="], "kvdir listening on http://");
    let addr = &kv.addr;
    let body = json!({"url": format!("http://127.0.0.1:{}", http.port), "dialect": "vllm",
        "events": "tcp://127.0.0.1:1", "replay": "tcp://127.0.0.1:3", "dp_size": 2,
        "block_size": 16});
    let r = request(addr, "POST", "/register", None, Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let name = format!("127.0.0.1:{}", http.port);
    assert_eq!(r.json()["instance_id"], name.as_str());
    let again = request(addr, "POST", "/register", None, Some(&body.to_string()));
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("listed already"), "{}", again.body);
    // Healthy and loaded without a start time (vLLM's several API servers): its events tell
    // its process apart, so its streams start at once.
    let i = eventually("the registered engine's streams", || {
        let i = instance(addr, &name).ok_or("not listed")?;
        (i["streams"] == json!([0, 1])).then_some(i.clone()).ok_or(i.to_string())
    });
    assert_eq!(i["incarnation_id"], "from-events", "{i}");
    assert_eq!(i["engine"]["identity_known"], true, "{i}");
    http.set(|s| s.start_time = Some(1.5));
    let i = eventually("the start time read", || {
        let i = instance(addr, &name).ok_or("not listed")?;
        let id = i["incarnation_id"] == "process_start_time_seconds=1.5";
        (id && i["streams"] == json!([0, 1])).then_some(i.clone()).ok_or(i.to_string())
    });
    let source = i["engine"]["source"].as_str();
    assert_eq!((i["dp_size"].as_u64(), source), (Some(2), Some("register")));
    let bad = json!({"url": "http://127.0.0.1:1/x", "dialect": "tgi", "events": "tcp://h:1"});
    let r = request(addr, "POST", "/register", None, Some(&bad.to_string()));
    assert_eq!(r.status, 400, "{}", r.body);
    for named in ["engine.url", "engine.dialect", "engine.replay: missing", "engine.block_size"] {
        assert!(r.body.contains(named), "{named} not in {}", r.body);
    }
    let gone = json!({ "instance_id": name }).to_string();
    let r = request(addr, "POST", "/unregister", None, Some(&gone));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["removed"].as_array().map(Vec::len), Some(2));
    assert!(instance(addr, &name).is_none(), "unlisted");
}

/// The instance's entries in a query for `tokens`: (rank, approximate, device hit tokens).
fn entries(addr: &str, name: &str, tokens: &[i32]) -> Vec<(u64, bool, u64)> {
    let body = json!({ "token_ids": tokens }).to_string();
    let r = request(addr, "POST", "/v1/internal/kv-cache/query", None, Some(&body));
    let matches = r.json()["matches"].as_array().cloned().unwrap_or_default();
    let mine = matches.iter().filter(|m| m["instance_name"] == name);
    mine.map(|m| {
        let n = |k: &str| m[k].as_u64().unwrap_or(u64::MAX);
        (n("dp_rank"), m["approximate"] == true, n("device_hit_tokens"))
    })
    .collect()
}

#[test]
fn an_engine_registered_without_events_is_credited_approximately_for_its_process_only() {
    let http = TestEngine::start();
    let kv = spawn(&["--http_server_port=0", "--etcd_addr="], "kvdir listening on http://");
    let addr = &kv.addr;
    let body = json!({"url": format!("http://127.0.0.1:{}", http.port), "dialect": "vllm",
        "dp_size": 2, "block_size": B});
    let r = request(addr, "POST", "/register", None, Some(&body.to_string()));
    assert_eq!((r.status, r.json()["dp_size"].as_u64()), (200, Some(2)), "{}", r.body);
    let name = format!("127.0.0.1:{}", http.port);
    let i = eventually("the engine known by its process, approximate", || {
        let i = instance(addr, &name).ok_or("not listed")?;
        (i["approximate_blocks"] == 0).then_some(i.clone()).ok_or(i.to_string())
    });
    assert_eq!((&i["approximate"], &i["streams"]), (&json!(true), &json!([])), "{i}");

    // Routed there once: the prompt's four blocks are assumed cached on both ranks.
    let tokens = prompt(7, 4);
    let route = |tokens: &[i32]| {
        let body = json!({ "token_ids": tokens }).to_string();
        let r = request(addr, "POST", "/v1/internal/route", None, Some(&body)).json();
        r["candidates"][0].clone()
    };
    let c = route(&tokens);
    assert_eq!(
        (&c["name"], &c["chosen"], &c["kv_hit_ratio"]),
        (&json!(name), &json!(true), &json!(0.0))
    );
    let held = 4 * u64::from(B);
    assert_eq!(entries(addr, &name, &tokens), [(0, true, held), (1, true, held)]);
    let c = route(&tokens);
    assert_eq!(c["kv_hit_ratio"], 0.75, "three blocks of four (never the last token's): {c}");
    assert!(c["dp_hits"].as_array().unwrap().iter().all(|h| h["approximate"] == true), "{c}");

    // Another process: its cache is empty, and so is its credit.
    http.set(|s| s.start_time = Some(1_764_599_000.5));
    eventually("the credit dropped with the old process", || {
        let e = entries(addr, &name, &tokens);
        (e == [(0, true, 0), (1, true, 0)]).then_some(()).ok_or(format!("{e:?}"))
    });
    route(&tokens);
    assert_eq!(entries(addr, &name, &tokens), [(0, true, held), (1, true, held)]);

    // Unregistered: no entry, no credit.
    let gone = json!({ "instance_id": name }).to_string();
    let r = request(addr, "POST", "/unregister", None, Some(&gone));
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("no entry once unregistered", || {
        let e = entries(addr, &name, &tokens);
        e.is_empty().then_some(()).ok_or(format!("{e:?}"))
    });
}

/// Regression (#35): a restarted engine got 503 from kvdir for up to a poll interval after its
/// `/health` turned 200, since kvdir marked it ACTIVE only at its next poll. A SUSPECT engine
/// is polled every 100 ms, so it is routable again well within the interval.
#[test]
fn a_suspect_engine_is_routable_again_soon_after_its_health_returns() {
    let http = TestEngine::start();
    let tmp = tempfile::tempdir().unwrap();
    let config = json!({"engines": [{"name": "vllm-a", "dialect": "vllm", "block_size": B,
        "url": format!("http://127.0.0.1:{}", http.port)}], "engine_poll_interval_ms": 5000});
    let path = tmp.path().join("engines.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let file = format!("--kv_events_config_file={}", path.display());
    let kv = spawn(&["--http_server_port=0", "--etcd_addr=", &file], "kvdir listening on http://");
    let addr = &kv.addr;
    let body = json!({ "token_ids": prompt(7, 4) }).to_string();
    let route = || request(addr, "POST", "/v1/internal/route", None, Some(&body)).status;
    eventually("routable after the first poll", || route() == 200);

    // Down: SUSPECT at its next poll (up to the 5 s interval), and not routed.
    http.set(|s| s.healthy = false);
    let slow = kvdir_testkit::Patience::new(Duration::from_secs(15));
    slow.eventually("SUSPECT while /health fails", || {
        let i = instance(addr, "vllm-a").unwrap();
        (i["state"] == "SUSPECT").then_some(()).ok_or(i.to_string())
    });
    assert_eq!(route(), 503);

    // Up again: routable within a second, not at the next regular poll.
    http.set(|s| s.healthy = true);
    let soon = kvdir_testkit::Patience::new(Duration::from_secs(1));
    soon.eventually("routable again within a second", || route() == 200);
}
