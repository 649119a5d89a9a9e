//! The front door end to end: kvdir discovers three simulated engines in a real etcd, each an
//! OpenAI-compatible server over its prefix cache; chat requests go client -> kvdir -> engine
//! -> KV events -> kvdir's directory -> the next route. The cache-truth audit's tests are in
//! [`audit`], overload admission's in [`overload`], the spread of requests in flight and of
//! siblings in [`spread`], engines listed without KV events in [`listed`], the tokenizer
//! parity check at registration in [`parity`], and routing to a vLLM engine's DP rank in
//! [`dp_rank`].

mod audit;
mod dp_rank;
mod listed;
mod overload;
mod parity;
mod spread;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::common::*;
use kvdir::car::{Policy, Routed};
use kvdir::config::{Flags, FrontDoorFlags};
use kvdir_sim::{EngineConfig, OpenAiConfig, Registration, RegistrationOptions, SimEngine};
use kvdir_testkit::etcd::etcd_endpoint;
use kvdir_text::TextModel;
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// The served model's name (the demo model directory's name).
const MODEL: &str = "kvdir-demo";

/// The demo model, written to a directory named [`MODEL`] inside a temporary directory that is
/// removed when the returned guard drops.
fn model_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join(MODEL);
    kvdir_text::demo::write_model(&dir).expect("the demo model is written");
    (tmp, dir)
}

fn model() -> Arc<TextModel> {
    static MODEL_: OnceLock<Arc<TextModel>> = OnceLock::new();
    Arc::clone(MODEL_.get_or_init(|| Arc::new(TextModel::load(&model_dir().1, None).unwrap())))
}

/// An engine serving the demo model, registered in etcd under `ns` with load reports.
fn serving(etcd: &str, ns: &str, openai: &OpenAiConfig) -> (SimEngine, Registration) {
    let engine = engine_on_free_port(1, |http_port| EngineConfig {
        http_port,
        block_size: B,
        device_capacity_blocks: 4096,
        openai: Some(openai.clone()),
        ..EngineConfig::default()
    });
    let opts = RegistrationOptions {
        etcd: etcd.into(),
        namespace: ns.into(),
        kind: 0,
        write_loadmetrics: true,
        ..RegistrationOptions::default()
    };
    let reg = Registration::start(&engine, opts).expect("registered");
    (engine, reg)
}

fn costs(prefill_us: u64, decode_us: u64, max_tokens: u32) -> OpenAiConfig {
    OpenAiConfig {
        prefill_us_per_token: prefill_us,
        decode_us_per_token: decode_us,
        max_tokens,
        ..OpenAiConfig::new(model(), MODEL)
    }
}

/// kvdir with the front door, following etcd namespace `ns`.
fn kvdir(etcd: &str, ns: &str, policy: Policy) -> kvdir_service::Service {
    kvdir_with(etcd, ns, policy, FrontDoorFlags::default())
}

/// [`kvdir`] with other front door flags (the demo model is always the tokenizer).
fn kvdir_with(
    etcd: &str,
    ns: &str,
    policy: Policy,
    front: FrontDoorFlags,
) -> kvdir_service::Service {
    // kvdir loads the model at start, so the directory can go when this returns.
    let (_tmp, dir) = model_dir();
    let front = FrontDoorFlags { tokenizer_path: Some(dir), ..front };
    let mut flags = Flags { front, ..Flags::default() };
    (flags.route.policy, flags.front.policy) = (policy, policy);
    discovery_service(etcd, ns, json!({}), flags)
}

/// Waits until kvdir routes over `n` instances with load reports and synchronized streams.
fn ready(svc: &kvdir_service::Service, n: usize) {
    eventually("every engine known, loaded and synchronized", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let list = inst["instances"].as_array().cloned().unwrap_or_default();
        let loaded = list.iter().filter(|i| i["waiting_requests_num"].is_u64()).count();
        let synced = query(svc, &[]).matches.iter().filter(|m| m.synchronized).count();
        if list.len() == n && loaded == n && synced == n {
            Ok(())
        } else {
            Err(format!("{} instances, {loaded} loaded, {synced} synchronized", list.len()))
        }
    });
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

fn chat(svc: &kvdir_service::Service, messages: &Value, stream: bool) -> Response {
    let body = json!({"model": MODEL, "messages": messages, "stream": stream});
    client()
        .post(format!("http://{}/v1/chat/completions", svc.http_addr()))
        .json(&body)
        .send()
        .expect("kvdir answers")
}

fn header(r: &Response, name: &str) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
}

/// The token ids the engine computes for `messages` (for polling kvdir's directory).
fn tokens_of(messages: &Value) -> Vec<i32> {
    let m = model();
    let text = m.chat_prompt(messages, None, true).unwrap();
    m.encode(&text, false).unwrap().into_iter().map(|t| t as i32).collect()
}

fn conversation(system: &str, question: &str) -> Value {
    json!([{"role": "system", "content": system}, {"role": "user", "content": question}])
}

fn long_system_prompt() -> String {
    kvdir_text::demo::CORPUS.lines().take(12).collect::<Vec<_>>().join(" ")
}

#[test]
fn a_shared_system_prompt_brings_the_next_chat_to_the_engine_that_holds_it() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-share-{}", std::process::id());
    let openai = costs(20, 0, 4);
    let engines: Vec<_> = (0..3).map(|_| serving(&etcd.endpoint, &ns, &openai)).collect();
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 3);
    let system = long_system_prompt();

    let first = conversation(&system, "What is the capital of France?");
    let r = chat(&svc, &first, false);
    assert_eq!(r.status().as_u16(), 200);
    let holder = header(&r, "x-kvdir-instance");
    assert_eq!(header(&r, "x-kvdir-policy"), "CAR");
    let body: Value = r.json().unwrap();
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{body}");
    assert!(body["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));

    // The engine's KV events reach kvdir's directory.
    let prompt = tokens_of(&first);
    eventually("the first prompt in kvdir's directory", || {
        let m = find_entry(&query(&svc, &prompt), &holder, 0).cloned();
        match m {
            Some(m) if m.device_hit_tokens > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    let second = conversation(&system, "And the capital of Spain?");
    let r = chat(&svc, &second, false);
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "x-kvdir-instance"), holder, "routed to the engine holding the prefix");
    let ratio: f64 = header(&r, "x-kvdir-kv-hit-ratio").parse().unwrap();
    assert!(ratio > 0.5, "most of the prompt is the shared system prompt: {ratio}");
    let body: Value = r.json().unwrap();
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    // The engine reuses the complete blocks of the prefix the two prompts share.
    let next = tokens_of(&second);
    let common = prompt.iter().zip(&next).take_while(|(a, b)| a == b).count() as u64;
    assert!(common > 200, "the system prompt is most of the prompt: {common}");
    assert_eq!(cached, common / u64::from(B) * u64::from(B), "{body}");

    // Discovered streams carry the model the engines registered; another model's query
    // leaves them out.
    let streams = report(&svc);
    assert!(
        streams["streams"].as_array().unwrap().iter().all(|s| s["model"] == MODEL),
        "{streams}"
    );
    let scoped = |model: &str| {
        let body = json!({"token_ids": prompt, "model": model}).to_string();
        let r = http(svc.http_addr(), "POST", "/v1/internal/kv-cache/query", &[], body.as_bytes());
        r.json()["matches"].as_array().map_or(0, Vec::len)
    };
    assert_eq!((scoped(MODEL), scoped("another-model")), (3, 0));

    // Both decisions are visible to operators.
    let recent = http(svc.http_addr(), "GET", "/v1/internal/route/recent", &[], b"").json();
    assert!(recent["total"].as_u64().unwrap() >= 2, "{recent}");
    let metrics = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    let line = format!("kvdir_frontend_requests_total{{instance=\"{holder}\",status=\"200\"}} 2");
    assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
    drop(engines);
}

#[test]
fn a_streamed_answer_passes_through_chunk_by_chunk() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-stream-{}", std::process::id());
    let (engine, _reg) = serving(&etcd.endpoint, &ns, &costs(0, 50_000, 8));
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 1);
    let r = chat(&svc, &conversation("Be brief.", "Count to eight."), true);
    assert_eq!(r.status().as_u16(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"), "{:?}", r.headers());
    let mut lines = BufReader::new(r).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: {"), "{first}");
    // The first chunk reached the client while the engine was still generating.
    assert_eq!(engine.in_flight().running, 1, "the engine is still decoding");
    let events: Vec<String> = std::iter::once(first)
        .chain(lines.map(Result::unwrap))
        .filter(|l| l.starts_with("data: "))
        .collect();
    assert_eq!(events.last().map(String::as_str), Some("data: [DONE]"));
    let tokens = events.iter().filter(|e| e.contains("\"content\"")).count();
    assert!(tokens >= 8, "one chunk per token: {events:?}");
    assert_eq!(engine.in_flight().running, 0);
}

#[test]
fn an_unreachable_engine_gets_one_retry_elsewhere_then_a_502() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-retry-{}", std::process::id());
    let openai = costs(0, 0, 2);
    let (a, _reg_a) = serving(&etcd.endpoint, &ns, &openai);
    let (b, _reg_b) = serving(&etcd.endpoint, &ns, &openai);
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Rr);
    ready(&svc, 2);
    let (dead, alive) = (a.instance_name(), b.instance_name());
    drop(a); // its registration stays: kvdir still lists it
    for i in 0..4 {
        let r = chat(&svc, &conversation("Hi.", &format!("question {i}")), false);
        assert_eq!(r.status().as_u16(), 200, "{:?}", r.text());
        assert_eq!(header(&r, "x-kvdir-instance"), alive);
    }
    let metrics = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    let line =
        format!("kvdir_frontend_requests_total{{instance=\"{dead}\",status=\"unreachable\"}}");
    assert!(metrics.contains(&line), "round-robin tried {dead}: {line} missing from\n{metrics}");

    drop(b);
    let r = chat(&svc, &conversation("Hi.", "anyone?"), false);
    assert_eq!(r.status().as_u16(), 502);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "upstream_unreachable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&dead) && message.contains(&alive), "{message}");
}

#[test]
fn a_client_that_goes_away_cancels_the_request_at_the_engine() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-cancel-{}", std::process::id());
    // 1,000 tokens at 50 ms each: the answer would take 50 s, past any deadline here.
    let (engine, _reg) = serving(&etcd.endpoint, &ns, &costs(0, 50_000, 1_000));
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 1);
    let r = chat(&svc, &conversation("Be long.", "Tell me everything."), true);
    assert_eq!(r.status().as_u16(), 200);
    let mut lines = BufReader::new(r).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: {"));
    assert_eq!(engine.in_flight().running, 1, "the engine is generating");
    drop(lines); // the client disconnects
    eventually("the engine to stop generating", || match engine.in_flight().running {
        0 => Ok(()),
        n => Err(format!("{n} running")),
    });
}

#[test]
fn an_engine_slower_than_the_upstream_timeout_is_a_504() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-timeout-{}", std::process::id());
    // 100 ms per prompt token: no response head for seconds.
    let (_engine, _reg) = serving(&etcd.endpoint, &ns, &costs(100_000, 0, 1));
    let front = FrontDoorFlags { upstream_timeout_ms: 300, ..FrontDoorFlags::default() };
    let svc = kvdir_with(&etcd.endpoint, &ns, Policy::Car, front);
    ready(&svc, 1);
    let r = chat(&svc, &conversation("Hi.", "Slowly, please."), false);
    assert_eq!(r.status().as_u16(), 504);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("300 ms"), "{body}");
}

#[test]
fn a_fully_cached_prompt_of_whole_blocks_is_credited_all_but_its_last_block() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-last-{}", std::process::id());
    let (_engine, _reg) = serving(&etcd.endpoint, &ns, &costs(0, 0, 2));
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 1);
    let whole = 4 * B as usize;
    let tokens = tokens_of(&conversation(&long_system_prompt(), "Hi"))[..whole].to_vec();
    let complete = || {
        let body = json!({"model": MODEL, "prompt": tokens});
        let url = format!("http://{}/v1/completions", svc.http_addr());
        client().post(url).json(&body).send().expect("kvdir answers")
    };
    assert_eq!(complete().status().as_u16(), 200);
    eventually("the prompt's four blocks in kvdir's directory", || {
        let m = query(&svc, &tokens).matches;
        let hit = m.first().map(|m| m.device_hit_tokens);
        (hit == Some(whole as u64)).then_some(()).ok_or_else(|| format!("{m:?}"))
    });
    let r = complete();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "x-kvdir-kv-hit-ratio"), "0.7500", "three blocks of four");
    assert_eq!(header(&r, "x-kvdir-stream-state"), "exact");
    let predicted = header(&r, "x-kvdir-cached-tokens");
    let body: Value = r.json().unwrap();
    let cached = &body["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached, 3 * B, "the engine reuses as much: {body}");
    assert_eq!(predicted, cached.to_string(), "kvdir predicts what the engine reports");
}

/// With `--frontend_policy TTFT` the front door routes with TTFT while `POST /v1/internal/route`
/// keeps CAR, and the first bytes of streamed answers (not of whole ones) teach kvdir the
/// prefill rate: the engine prefills 1,000 tokens per second (1 ms each), ten times slower than
/// the configured 10,000; any delay on the way only makes the learned rate lower.
#[test]
fn the_front_door_routes_with_ttft_and_learns_the_engines_prefill_rate() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-ttft-{}", std::process::id());
    let (engine, _reg) = serving(&etcd.endpoint, &ns, &costs(1_000, 0, 1));
    let (_tmp, dir) = model_dir();
    let policy = Policy::Ttft;
    let front = FrontDoorFlags { tokenizer_path: Some(dir), policy, ..FrontDoorFlags::default() };
    let svc =
        discovery_service(&etcd.endpoint, &ns, json!({}), Flags { front, ..Flags::default() });
    ready(&svc, 1);
    let messages = conversation(&long_system_prompt(), "How long is the prefill?");
    let tokens = tokens_of(&messages);
    assert!(tokens.len() >= 256, "enough work to learn from: {} tokens", tokens.len());
    let ttft_terms = |routed: &Routed| {
        let c = routed.candidates.iter().find(|c| c.name == engine.instance_name());
        c.and_then(|c| c.ttft).ok_or_else(|| format!("no TTFT terms: {routed:?}"))
    };
    // A whole JSON answer's first byte comes after its decode: it ends the request, teaches
    // nothing.
    let r = chat(&svc, &messages, false);
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "x-kvdir-policy"), "TTFT");
    drop(r.text());
    let after_whole = eventually("the whole answer to leave the queue", || {
        let t = ttft_terms(&route(&svc, &tokens)?)?;
        if t.queued_requests == 0 {
            Ok(t)
        } else {
            Err(format!("{t:?}"))
        }
    });
    assert_eq!(after_whole.rate_source, kvdir::car::RateSource::Configured, "{after_whole:?}");
    // A streamed answer's first byte is its first token; another prompt, so none is cached.
    let other = format!("Streamed. {}", long_system_prompt());
    let r = chat(&svc, &conversation(&other, "And streamed?"), true);
    assert_eq!(r.status().as_u16(), 200);
    drop(r.text());
    let learned = eventually("the route answer to show a learned rate", || {
        let routed = route(&svc, &tokens)?;
        let c = routed.candidates.iter().find(|c| c.name == engine.instance_name()).ok_or("?")?;
        match (routed.policy, c.ttft) {
            (Policy::Car, Some(t)) if t.rate_source == kvdir::car::RateSource::Learned => Ok(t),
            other => Err(format!("{other:?}")),
        }
    });
    // 1,000 tokens per second, less the fixed terms of the estimate (at most 15 ms).
    assert!(learned.prefill_tokens_per_s < 2_000.0, "{learned:?}");
}
