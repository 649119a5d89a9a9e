//! The vLLM dialect's HTTP surface on a real port: `GET /health` is an empty 200,
//! `GET /metrics` is Prometheus text with `process_start_time_seconds` and the per-rank
//! `vllm:` load gauges, a restart shows a new process start time on the same port, and
//! `cached_tokens` never counts the prompt's last token. The xLLM dialect keeps its JSON
//! health and has no `/metrics`. Without `X-data-parallel-rank` a DP request goes where vLLM's
//! cache-blind balancer puts it; with it, to the named rank.

use crate::common;
use crate::openai_support;

use kvdir_sim::{Dialect, EngineConfig, SimEngine};
use openai_support::{cached, client, engine, eventually, openai, post, B, MODEL};
use serde_json::json;

fn vllm(dp_size: u32, device_capacity_blocks: usize) -> SimEngine {
    engine(EngineConfig {
        dp_size,
        device_capacity_blocks,
        dialect: Dialect::Vllm,
        openai: Some(openai()),
        ..EngineConfig::default()
    })
}

/// `(status, content type, body)` of `GET path`.
fn get(engine: &SimEngine, path: &str) -> (u16, String, String) {
    let url = format!("http://{}{path}", engine.instance_name());
    let response = client().get(url).send().expect("the engine answers");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, content_type, response.text().expect("a body"))
}

/// The value of the sample `series` (name and labels as written) in `/metrics`.
fn sample(engine: &SimEngine, series: &str) -> f64 {
    let (status, _, text) = get(engine, "/metrics");
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"));
    line.parse().unwrap_or_else(|_| panic!("{series} has no number: {line:?}"))
}

fn labelled(name: &str, rank: u32) -> String {
    format!("{name}{{engine=\"{rank}\",model_name=\"{MODEL}\"}}")
}

fn prompt(first: i32, len: usize) -> Vec<i32> {
    (first..).take(len).collect()
}

#[test]
fn health_is_an_empty_200_and_metrics_are_prometheus_text_per_rank() {
    let engine = vllm(2, 16);
    let (status, _, body) = get(&engine, "/health");
    assert_eq!((status, body.as_str()), (200, ""));
    let (status, content_type, text) = get(&engine, "/metrics");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    for name in
        ["process_start_time_seconds", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]
    {
        assert!(text.contains(&format!("# TYPE {name} gauge")), "{name} missing:\n{text}");
    }
    let started = sample(&engine, "process_start_time_seconds");
    assert!((started - engine.process_start_time()).abs() < 0.01, "{started}");
    for rank in 0..2 {
        for name in ["vllm:num_requests_running", "vllm:num_requests_waiting"] {
            assert_eq!(sample(&engine, &labelled(name, rank)), 0.0);
        }
        assert_eq!(sample(&engine, &labelled("vllm:kv_cache_usage_perc", rank)), 0.0);
    }
    engine.process(1, &prompt(0, 8 * B as usize)).unwrap();
    assert_eq!(sample(&engine, &labelled("vllm:kv_cache_usage_perc", 1)), 0.5, "8 of 16 blocks");
    assert_eq!(sample(&engine, &labelled("vllm:kv_cache_usage_perc", 0)), 0.0);
}

#[test]
fn a_request_producing_tokens_is_running_on_its_rank_until_it_ends() {
    let engine = engine(EngineConfig {
        dialect: Dialect::Vllm,
        openai: Some(kvdir_sim::OpenAiConfig { decode_us_per_token: 1000, ..openai() }),
        ..EngineConfig::default()
    });
    let body = json!({"model": MODEL, "prompt": prompt(1, 9), "max_tokens": 1000, "stream": true});
    let url = format!("http://{}/v1/completions", engine.instance_name());
    let request = client().post(url).header("content-type", "application/json");
    let stream = request.body(body.to_string()).send().expect("the stream starts");
    assert_eq!(stream.status(), 200);
    let running = labelled("vllm:num_requests_running", 0);
    assert_eq!(sample(&engine, &running), 1.0, "the answer has started: the request runs");
    assert_eq!(sample(&engine, &labelled("vllm:num_requests_waiting", 0)), 0.0);
    drop(stream);
    eventually("the ended request leaves the running gauge", || sample(&engine, &running) == 0.0);
}

#[test]
fn a_restart_shows_a_new_process_start_time_on_the_same_port() {
    let engine = vllm(2, 16);
    let before = sample(&engine, "process_start_time_seconds");
    engine.process(0, &prompt(0, 4 * B as usize)).unwrap();
    engine.restart_all().unwrap();
    let after = sample(&engine, "process_start_time_seconds");
    assert!(after > before, "{after} after {before}");
    assert_eq!(after, engine.process_start_time());
    assert_eq!(sample(&engine, &labelled("vllm:kv_cache_usage_perc", 0)), 0.0, "cache emptied");
    engine.restart(1).unwrap();
    assert!(sample(&engine, "process_start_time_seconds") > after, "every restart is new");
}

#[test]
fn cached_tokens_never_include_the_prompts_last_token() {
    let engine = vllm(1, 64);
    let b = B as usize;
    // (prompt length, cached on the second send): a block-aligned prompt reuses one block
    // less; one more token reuses every full block.
    for (first, len, expected) in [(0, 3 * b, 2 * b), (100, 3 * b + 1, 3 * b), (200, 1, 0)] {
        let body = json!({"prompt": prompt(first, len), "max_tokens": 1}).to_string();
        assert_eq!(cached(&post(&engine, "/v1/completions", &body)), 0);
        let again = post(&engine, "/v1/completions", &body);
        assert_eq!(cached(&again), expected as u64, "a prompt of {len} tokens: {}", again.body);
        assert_eq!(engine.cached_tokens(0, &prompt(first, len), None).unwrap(), expected as u64);
    }
    let xllm = engine_xllm();
    let body = json!({"prompt": prompt(0, 3 * b), "max_tokens": 1}).to_string();
    post(&xllm, "/v1/completions", &body);
    assert_eq!(cached(&post(&xllm, "/v1/completions", &body)), 2 * B as u64, "xLLM alike");
}

fn engine_xllm() -> SimEngine {
    engine(EngineConfig { openai: Some(openai()), ..EngineConfig::default() })
}

#[test]
fn the_xllm_dialect_keeps_its_json_health_and_has_no_metrics() {
    let engine = engine_xllm();
    let (status, content_type, body) = get(&engine, "/health");
    assert_eq!(
        (status, content_type.as_str(), body.as_str()),
        (200, "application/json", r#"{"status":"ok"}"#)
    );
    assert_eq!(get(&engine, "/metrics").0, 404);
}

#[test]
fn a_cache_salt_keys_the_prompt_apart_and_travels_in_the_first_blocks_extra_keys() {
    let engine = vllm(1, 64);
    let sub = common::Subscriber::connect(&engine, 0);
    let tokens = prompt(0, 3 * B as usize + 1);
    let body = |salt: Option<&str>| {
        let mut body = json!({"prompt": tokens, "max_tokens": 1});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        body.to_string()
    };
    assert_eq!(cached(&post(&engine, "/v1/completions", &body(Some("tenant-a")))), 0);
    let frames = sub.recv(openai_support::DEADLINE).expect("the salted request's batch");
    let has = |needle: &[u8]| frames[2].windows(needle.len()).any(|w| w == needle);
    assert!(has(b"extra_keys") && has(b"tenant-a"), "the salt is published");
    let full = 3 * u64::from(B);
    assert_eq!(cached(&post(&engine, "/v1/completions", &body(Some("tenant-a")))), full);
    assert_eq!(engine.cached_tokens(0, &tokens, Some("tenant-a")).unwrap(), full);
    assert_eq!(cached(&post(&engine, "/v1/completions", &body(Some("tenant-b")))), 0);
    assert_eq!(cached(&post(&engine, "/v1/completions", &body(None))), 0, "unsalted is apart");
    let frames = sub.recv(openai_support::DEADLINE).expect("tenant-b's batch");
    assert!(!frames[2].windows(8).any(|w| w == b"tenant-a"));
    let bad = json!({"prompt": tokens, "cache_salt": 5}).to_string();
    assert_eq!(post(&engine, "/v1/completions", &bad).status, 400);
    assert_eq!(post(&engine_xllm(), "/v1/completions", &bad).status, 200, "xLLM ignores it");
}

/// POSTs a completion of `tokens` with `X-data-parallel-rank: rank` (none when `None`) and
/// answers `(status, serving rank, cached tokens)`.
fn complete_on(engine: &SimEngine, tokens: &[i32], rank: Option<&str>) -> (u16, Option<u32>, u64) {
    let url = format!("http://{}/v1/completions", engine.instance_name());
    let mut request = client().post(url).header("content-type", "application/json");
    if let Some(rank) = rank {
        request = request.header("X-data-parallel-rank", rank);
    }
    let body = json!({"prompt": tokens, "max_tokens": 1}).to_string();
    let response = request.body(body).send().expect("the engine answers");
    let rank = response.headers().get(kvdir_sim::DP_RANK_HEADER).map(|v| v.to_str().unwrap());
    let rank = rank.and_then(|v| v.parse().ok());
    let status = response.status().as_u16();
    let cached = response.headers().get("x-sim-cached-tokens").map(|v| v.to_str().unwrap());
    (status, rank, cached.and_then(|v| v.parse().ok()).unwrap_or(0))
}

#[test]
fn without_a_rank_header_vllm_balances_blind_to_the_cache_and_with_one_it_obeys() {
    let engine = vllm(2, 64);
    let tokens = prompt(500, 3 * B as usize + 1);
    // vLLM's own balancer: idle ranks take requests in turn, wherever the prompt is cached.
    let (first, second) =
        (complete_on(&engine, &tokens, None), complete_on(&engine, &tokens, None));
    assert_eq!((first.1, second.1), (Some(0), Some(1)), "round robin: {first:?} {second:?}");
    assert_eq!(second.2, 0, "rank 1 never saw the prompt");
    // The header names the rank, which reports its own cache.
    assert_eq!(complete_on(&engine, &tokens, Some("0")), (200, Some(0), 3 * B as u64));
    assert_eq!(complete_on(&engine, &tokens, Some("1")), (200, Some(1), 3 * B as u64));
    assert_eq!(complete_on(&engine, &tokens, Some("2")).0, 400, "out of range");
    let ignored = complete_on(&engine, &tokens, Some("one"));
    assert_eq!(ignored.0, 200, "vLLM ignores a value that is not an integer");
}
