//! Overload admission end to end: one simulated engine with a slow prefill, kvdir with
//! `--overload_ttft_ms`; a second request waits in kvdir while the first one prefills, a third
//! finds the queue full and gets 429 with `Retry-After`, and a client that leaves while held
//! leaves the queue.

use std::io::Write;
use std::net::TcpStream;

use kvdir::overload::OverloadParams;

use super::*;

/// kvdir with the front door over the demo model and `flags`, following etcd namespace `ns`.
fn kvdir_flags(etcd: &str, ns: &str, mut flags: Flags) -> kvdir_service::Service {
    let (_tmp, dir) = model_dir();
    flags.front.tokenizer_path = Some(dir);
    discovery_service(etcd, ns, json!({}), flags)
}

/// Prompt tokens of each request: with the engine at 4 ms per token, 2 s of prefill.
const PROMPT: usize = 500;

/// A completion body of [`PROMPT`] token ids (the demo model has 626) unique to `k`: no prefix
/// shared with another `k`.
fn completion(k: usize) -> String {
    let ids: Vec<usize> = (0..PROMPT).map(|i| 10 + (k * 131 + i * 7) % 600).collect();
    json!({"model": MODEL, "prompt": ids, "max_tokens": 1}).to_string()
}

/// One line of kvdir's `/metrics`: the value of the series `name` (with its labels).
fn metric(svc: &kvdir_service::Service, name: &str) -> f64 {
    let text = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

fn metric_reaches(svc: &kvdir_service::Service, name: &str, value: f64) {
    eventually(&format!("{name} = {value}"), || match metric(svc, name) {
        v if v == value => Ok(()),
        v => Err(format!("{v}")),
    });
}

/// Sends completion `k` on its own thread: its status and body.
fn send(svc: &kvdir_service::Service, k: usize) -> std::thread::JoinHandle<(u16, String)> {
    let url = format!("http://{}/v1/completions", svc.http_addr());
    std::thread::spawn(move || {
        let r = client().post(url).body(completion(k)).send().expect("kvdir answers");
        (r.status().as_u16(), r.text().unwrap_or_default())
    })
}

#[test]
fn a_request_waits_while_the_engine_is_behind_then_is_served_and_past_the_queue_gets_429() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-overload-{}", std::process::id());
    let (engine, _reg) = serving(&etcd.endpoint, &ns, &costs(4_000, 0, 1));
    let mut flags = Flags::default();
    // The estimate's rate is the engine's: 250 tokens per second. One request alone is
    // estimated at about 2 s, within the bound; a second one behind it at about 4 s.
    flags.route.ttft.tokens_per_s = 250.0;
    flags.front.overload = OverloadParams { ttft_bound_ms: 3_000, queue: 2, max_wait_ms: 600_000 };
    let svc = kvdir_flags(&etcd.endpoint, &ns, flags);
    ready(&svc, 1);

    let first = send(&svc, 1);
    eventually("the first request at the engine", || match engine.in_flight() {
        f if f.running + f.waiting == 1 => Ok(()),
        f => Err(format!("{f:?}")),
    });
    let second = send(&svc, 2);
    metric_reaches(&svc, "kvdir_frontend_overload_held_total", 1.0);
    // A client that leaves while held: a raw connection, closed once its request is held.
    let mut leaving = TcpStream::connect(svc.http_addr()).unwrap();
    let body = completion(3);
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: kvdir\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    leaving.write_all(head.as_bytes()).unwrap();
    leaving.write_all(body.as_bytes()).unwrap();
    metric_reaches(&svc, "kvdir_frontend_overload_queue_length", 2.0);
    let recent = http(svc.http_addr(), "GET", "/v1/internal/route/recent", &[], b"").json();
    let overload = &recent["overload"];
    assert_eq!((&overload["queue_length"], &overload["ttft_bound_ms"]), (&json!(2), &json!(3000)));

    // The queue is full: refused at once, with when to come back and what to change.
    let r = client()
        .post(format!("http://{}/v1/completions", svc.http_addr()))
        .body(completion(4))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = header(&r, "retry-after").parse().expect("Retry-After in seconds");
    assert!(retry >= 1, "{retry}");
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--overload_queue = 2") && message.contains("3000"), "{message}");

    drop(leaving);
    metric_reaches(&svc, "kvdir_frontend_overload_withdrawn_total", 1.0);
    metric_reaches(&svc, "kvdir_frontend_overload_queue_length", 1.0);

    // The first request's prefill ends; the held one goes and is served.
    let (status, text) = first.join().unwrap();
    assert_eq!(status, 200, "{text}");
    let (status, text) = second.join().unwrap();
    assert_eq!(status, 200, "the held request is served: {text}");
    assert_eq!(metric(&svc, "kvdir_frontend_overload_released_total{reason=\"capacity\"}"), 1.0);
    assert_eq!(metric(&svc, "kvdir_frontend_overload_released_total{reason=\"max_wait\"}"), 0.0);
    assert_eq!(metric(&svc, "kvdir_frontend_overload_refused_total"), 1.0);
    assert_eq!(metric(&svc, "kvdir_frontend_overload_queue_length"), 0.0);
    let refused = "kvdir_frontend_requests_total{instance=\"\",status=\"429\"}";
    assert_eq!(metric(&svc, refused), 1.0);
    assert_eq!(engine.in_flight().running + engine.in_flight().waiting, 0);
}

#[test]
fn a_request_held_past_its_maximum_wait_is_sent_anyway() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-overload-wait-{}", std::process::id());
    let (_engine, _reg) = serving(&etcd.endpoint, &ns, &costs(4_000, 0, 1));
    let mut flags = Flags::default();
    // Every request is above the bound, even on an idle engine.
    flags.route.ttft.tokens_per_s = 250.0;
    flags.front.overload = OverloadParams { ttft_bound_ms: 100, queue: 4, max_wait_ms: 200 };
    let svc = kvdir_flags(&etcd.endpoint, &ns, flags);
    ready(&svc, 1);
    let (status, text) = send(&svc, 1).join().unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(metric(&svc, "kvdir_frontend_overload_held_total"), 1.0);
    assert_eq!(metric(&svc, "kvdir_frontend_overload_released_total{reason=\"max_wait\"}"), 1.0);
}
