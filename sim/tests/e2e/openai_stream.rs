//! Streaming and load of the OpenAI engine over real loopback HTTP: SSE chunks arrive one per
//! token while they are produced, a client that disconnects stops the generation, requests in
//! prefill count as waiting (in `in_flight` and in heartbeats), and the HTTP port is freed
//! when the engine drops.

use crate::etcd_support;
use crate::openai_support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use kvdir_sim::{EngineConfig, InFlight, OpenAiConfig, Registration, RegistrationOptions};
use kvdir_testkit::etcd::etcd_endpoint;
use openai_support::{chat, client, engine, eventually, openai, post, serving, system_prompt};
use serde_json::{json, Value};

/// Reads SSE `data:` lines as they arrive; returns each with its arrival time.
fn read_events(response: reqwest::blocking::Response) -> Vec<(Instant, String)> {
    let mut events = Vec::new();
    for line in BufReader::new(response).lines() {
        let line = line.expect("a line");
        if let Some(data) = line.strip_prefix("data: ") {
            events.push((Instant::now(), data.to_string()));
        }
    }
    events
}

fn stream_request(engine: &kvdir_sim::SimEngine, body: &Value) -> reqwest::blocking::Response {
    let url = format!("http://{}/v1/chat/completions", engine.instance_name());
    let response = client().post(url).json_body(body).send().expect("the engine answers");
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    response
}

/// `RequestBuilder::json` needs reqwest's `json` feature; this sends the text instead.
trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::blocking::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json").body(body.to_string())
    }
}

#[test]
fn a_stream_sends_one_chunk_per_token_as_it_is_produced_then_usage_and_done() {
    let decode = Duration::from_millis(40);
    let n = 8;
    let config =
        OpenAiConfig { decode_us_per_token: decode.as_micros() as u64, max_tokens: n, ..openai() };
    let engine = serving(1, config);
    let options = json!({"stream": true, "stream_options": {"include_usage": true}});
    let body = chat(&system_prompt(3), "Stream to me.", options);
    let events = read_events(stream_request(&engine, &body));

    assert_eq!(events.len(), n as usize + 2, "{n} tokens, usage, [DONE]: {events:?}");
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    let (first, last_token) = (events[0].0, events[n as usize - 1].0);
    let spread = last_token.duration_since(first);
    assert!(
        spread >= decode * (n - 2),
        "the first chunk arrived {spread:?} before the last token, not all at once"
    );
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[n as usize - 1]["choices"][0]["finish_reason"], "length");
    let usage = &chunks[n as usize]["usage"];
    assert_eq!(usage["completion_tokens"], n);
    assert_eq!(chunks[n as usize]["choices"], json!([]));

    let streamed: String = chunks[..n as usize]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap().to_string())
        .collect();
    let whole = post(
        &engine,
        "/v1/chat/completions",
        &chat(&system_prompt(3), "Stream to me.", json!({})).to_string(),
    );
    assert_eq!(whole.body["choices"][0]["message"]["content"], streamed.as_str());
    assert!(whole.body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));
}

#[test]
fn a_stream_without_include_usage_ends_with_done_after_the_tokens() {
    let engine = serving(1, OpenAiConfig { max_tokens: 3, ..openai() });
    let events = read_events(stream_request(&engine, &chat("s", "u", json!({"stream": true}))));
    let data: Vec<&str> = events.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(data.len(), 4, "{data:?}");
    assert_eq!(data[3], "[DONE]");
    assert!(data[..3].iter().all(|d| !d.contains("usage")), "{data:?}");

    let url = format!("http://{}/v1/completions", engine.instance_name());
    let body = json!({"prompt": "Once upon a time", "stream": true, "max_tokens": 2});
    let response = client().post(url).json_body(&body).send().unwrap();
    let events = read_events(response);
    assert_eq!(events.len(), 3, "{events:?}");
    let chunk: Value = serde_json::from_str(&events[1].1).unwrap();
    assert_eq!(chunk["object"], "text_completion");
    assert_eq!(chunk["choices"][0]["finish_reason"], "length");
    assert!(chunk["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{chunk}");
}

#[test]
fn a_client_that_disconnects_mid_stream_stops_the_generation() {
    // 1000 tokens at 20 ms would take 20 s; the request must be gone long before.
    let config = OpenAiConfig { decode_us_per_token: 20_000, max_tokens: 1000, ..openai() };
    let engine = serving(1, config);
    let response = stream_request(&engine, &chat("s", "u", json!({"stream": true})));
    let mut lines = BufReader::new(response).lines();
    let first = lines.next().expect("a first line").expect("readable");
    assert!(first.starts_with("data: "), "{first}");
    assert_eq!(engine.in_flight(), InFlight { waiting: 0, running: 1 });
    let started = Instant::now();
    drop(lines);
    eventually("the cancelled request leaves the load", || {
        engine.in_flight() == InFlight::default()
    });
    assert!(started.elapsed() < Duration::from_secs(10), "stopped early, not at the end");
}

#[test]
fn requests_in_prefill_count_as_waiting_in_in_flight_and_in_heartbeats() {
    let etcd = etcd_endpoint();
    // 1 s per uncached token: the request stays in prefill until the engine drops.
    let engine = serving(1, OpenAiConfig { prefill_us_per_token: 1_000_000, ..openai() });
    let sink = etcd_support::HeartbeatSink::start(200);
    let options = RegistrationOptions {
        etcd: etcd.endpoint.clone(),
        heartbeat_to: Some(sink.addr()),
        heartbeat_interval: Duration::from_millis(50),
        write_loadmetrics: true,
        ..RegistrationOptions::default()
    };
    let registration = Registration::start(&engine, options).expect("registers");
    registration.set_load(2, 0.0);
    let addr = engine.instance_name();
    let body = chat(&system_prompt(4), "Take your time.", json!({})).to_string();
    let request = thread::spawn(move || {
        let url = format!("http://{addr}/v1/chat/completions");
        let answer = client().post(url).json_body(&serde_json::from_str(&body).unwrap());
        answer.timeout(Duration::from_secs(600)).send().map(|r| r.status().as_u16())
    });
    eventually("the request waits in prefill", || engine.in_flight().waiting == 1);
    let beat = sink.wait_for(|b| b.body["load_metrics"]["waiting_requests_num"] == 3);
    assert_eq!(beat.body["name"], engine.instance_name(), "set load 2 + 1 in prefill");
    // set_load wrote 2 before the request; the keepalive rewrites LOADMETRICS when it changes.
    let reader = etcd_support::EtcdReader::new(&etcd);
    let key = format!("XLLM:LOADMETRICS:{}", engine.instance_name());
    let waiting = || {
        let value: Value = serde_json::from_slice(&reader.get(&key)?.value).ok()?;
        value["waiting_requests_num"].as_u64()
    };
    eventually("LOADMETRICS counts the request in prefill", || waiting() == Some(3));
    drop(engine);
    assert!(request.join().unwrap().is_err(), "stopping the engine ends the request");
    drop(registration);
}

#[test]
fn health_answers_until_drop_and_the_port_is_free_again_at_once() {
    let first = engine(EngineConfig::default());
    let config = first.config().clone();
    let url = format!("http://{}/health", first.instance_name());
    let ok = client().get(&url).send().unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().unwrap(), r#"{"status":"ok"}"#);
    assert_eq!(client().get(url.replace("/health", "/other")).send().unwrap().status(), 404);
    assert_eq!(client().post(&url).body("{}").send().unwrap().status(), 404);
    drop(first);
    assert!(client().get(&url).send().is_err(), "nothing listens after drop");
    let port = config.http_port;
    TcpListener::bind(("127.0.0.1", port)).expect("the port is free after drop");
    let again = kvdir_sim::SimEngine::start(config).expect("a new engine starts on the same port");
    assert_eq!(client().get(&url).send().unwrap().status(), 200);
    drop(again);
}

#[test]
fn a_tie_on_cached_prefix_goes_to_the_rank_with_fewer_requests_in_flight() {
    // 1 s per uncached token: the first request stays in prefill on rank 0 until the drop.
    let engine = serving(2, OpenAiConfig { prefill_us_per_token: 1_000_000, ..openai() });
    let addr = engine.instance_name();
    let slow = thread::spawn(move || {
        let body = json!({"prompt": (300..340).collect::<Vec<i32>>()});
        let url = format!("http://{addr}/v1/completions");
        let request = client().post(url).json_body(&body).timeout(Duration::from_secs(600));
        request.send().map(|r| r.status().as_u16())
    });
    eventually("the slow request is on rank 0", || engine.in_flight_on(0) == 1);
    assert_eq!(engine.in_flight(), InFlight { waiting: 1, running: 0 }, "it is in prefill");
    // Both ranks hold the whole second prompt (whole blocks): no prefill, a tie on the prefix.
    let cached: Vec<i32> = (100..100 + 4 * openai_support::B as i32).collect();
    engine.process(0, &cached).unwrap();
    engine.process(1, &cached).unwrap();
    let answer = post(&engine, "/v1/completions", &json!({"prompt": cached}).to_string());
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.rank, Some(1), "rank 0 is busy with the slow request");
    assert_eq!((engine.in_flight_on(0), engine.in_flight_on(1)), (1, 0), "the fast one is done");
    drop(engine);
    assert!(slow.join().unwrap().is_err(), "stopping the engine ends the slow request");
}
