//! Engines that connect to kvdir (`kv_events_bind`), end to end on loopback: kvdir binds one
//! SUB port per DP rank, and each test engine's rank r connects its publisher to port + r and
//! publishes vLLM batches under its topic, as vLLM does when its `endpoint` is not a wildcard.
//! Each rank answers history replays on its own ROUTER, as vLLM's `replay_endpoint` does, and
//! the engine's HTTP side (`/health`, `/metrics`) gives kvdir its process identity.
//!
//! What a user sees: the streams report (phase, endpoint, the bind counters), `/metrics`, and
//! query hits per instance and rank. Engines that announce themselves by their topic are in
//! [`announce`]; the ports kvdir listens on itself, under faults and many connections, in
//! [`listener`], and out of descriptors in [`accept_fds`].

mod accept_fds;
mod announce;
mod listener;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::common::*;
use kvdir::config::{parse_config_file, Flags};
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{encode_batch, encode_live, Tier};
use kvdir_service::Service;
use kvdir_testkit::etcd::etcd_endpoint;
use serde_json::{json, Value};

static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// `n` consecutive ports of 127.0.0.1 that are free now, none handed out before in this test
/// binary (tests run in parallel).
fn free_ports(n: u16) -> u16 {
    let base = 40_000 + (std::process::id() % 200) as u16 * 50;
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    loop {
        let p = base + NEXT_PORT.fetch_add(n, Ordering::Relaxed);
        assert!(p < 60_000, "ran out of test ports");
        if (p..p + n).all(free) {
            return p;
        }
    }
}

/// One rank of a test engine: a publisher connected to kvdir's port for the rank, and the
/// batches it published, served as history on a ROUTER.
struct Rank {
    publisher: zmq::Socket,
    topic: String,
    rank: u32,
    history: Arc<Mutex<Vec<Vec<u8>>>>,
    replay: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Rank {
    /// vLLM's rank `rank` publishing under `topic` to `tcp://127.0.0.1:port`, answering
    /// history replays on an ephemeral port.
    fn connect(ctx: &zmq::Context, port: u16, topic: &str, rank: u32) -> Rank {
        Rank::start(ctx, port, topic, rank, ("tcp://127.0.0.1:*", false))
    }

    /// vLLM's rank 0 publishing under `topic` to `tcp://127.0.0.1:port`, answering history
    /// replays on `replay`.
    fn with_replay(ctx: &zmq::Context, port: u16, topic: &str, replay: &str) -> Rank {
        Rank::start(ctx, port, topic, 0, (replay, false))
    }

    /// An xLLM engine publishing under `topic` to `tcp://127.0.0.1:port`, answering
    /// snapshots on `replay`.
    fn xllm(ctx: &zmq::Context, port: u16, topic: &str, replay: &str) -> Rank {
        Rank::start(ctx, port, topic, 0, (replay, true))
    }

    fn start(ctx: &zmq::Context, port: u16, topic: &str, rank: u32, replay: (&str, bool)) -> Rank {
        // XPUB: it sees kvdir's subscription, so the test knows when a batch is delivered.
        let publisher = ctx.socket(zmq::XPUB).unwrap();
        publisher.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.bind(replay.0).unwrap();
        let snapshot = replay.1;
        let replay = router.get_last_endpoint().unwrap().unwrap();
        let (history, stop) =
            (Arc::<Mutex<Vec<Vec<u8>>>>::default(), Arc::new(AtomicBool::new(false)));
        let (h, halt, t) = (Arc::clone(&history), Arc::clone(&stop), topic.to_string());
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                if router.poll(zmq::POLLIN, 20).unwrap() == 0 {
                    continue;
                }
                let request = router.recv_multipart(0).unwrap();
                match snapshot {
                    true => answer_snapshot(&router, &request[0], &h),
                    false => answer_history(&router, &request, &h, &t),
                }
            }
        });
        Rank { publisher, topic: topic.into(), rank, history, replay, stop, thread: Some(thread) }
    }

    /// Waits until kvdir's SUB socket has subscribed through this connection.
    fn wait_subscribed(&self) {
        eventually("kvdir's subscription", || match self.publisher.recv_bytes(zmq::DONTWAIT) {
            Ok(m) if m.first() == Some(&1) => Ok(()),
            _ => Err("not yet".to_string()),
        })
    }

    /// Publishes one batch storing `tokens` on Device (one block per [`B`] tokens), keeps it
    /// in the history, and sends it live.
    fn store(&self, tokens: &[i32]) {
        let hashes: Vec<WireHash> = tokens
            .chunks(B as usize)
            .map(|c| WireHash::Uint(c[0] as u64 * 1_000_003 + u64::from(self.rank)))
            .collect();
        let record = StoredRecord::new(hashes, None, tokens.to_vec(), B, Tier::Device);
        let payload = batch(vec![EventRecord::Stored(record)], self.rank);
        let seq = {
            let mut h = self.history.lock().unwrap();
            h.push(payload.clone());
            h.len() as u64 - 1
        };
        let frames = encode_live(self.topic.as_bytes(), seq, payload);
        self.publisher.send_multipart(frames, 0).unwrap();
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(JoinHandle::join);
    }
}

/// One vLLM-shaped batch of `events` from rank `rank`.
fn batch(events: Vec<EventRecord>, rank: u32) -> Vec<u8> {
    let batch = BatchRecord { timestamp: 0.0, events, dp_rank: Some(rank) };
    encode_batch(&batch, BatchForm::Map, EventForm::Positional)
}

/// Answers a history request (`[id, "", start_seq]`) from the asked sequence on, then the end.
fn answer_history(
    router: &zmq::Socket,
    request: &[Vec<u8>],
    history: &Mutex<Vec<Vec<u8>>>,
    topic: &str,
) {
    let start = u64::from_be_bytes(request[2][..].try_into().unwrap());
    let batches = history.lock().unwrap().clone();
    for (seq, payload) in batches.iter().enumerate().skip(start as usize) {
        let seq = (seq as u64).to_be_bytes();
        let reply = [&request[0][..], b"", topic.as_bytes(), &seq[..], payload];
        router.send_multipart(reply, 0).unwrap();
    }
    router.send_multipart([&request[0][..], b"", b"", &[0xff; 8][..], b""], 0).unwrap();
}

/// Answers a snapshot request as xLLM does: the whole state (here an empty batch, then every
/// batch so far), each reply tagged with the first sequence it does not hold, then the end.
fn answer_snapshot(router: &zmq::Socket, id: &[u8], history: &Mutex<Vec<Vec<u8>>>) {
    let batches = history.lock().unwrap().clone();
    let watermark = (batches.len() as u64).to_be_bytes();
    for payload in std::iter::once(batch(Vec::new(), 0)).chain(batches) {
        router.send_multipart([id, b"", &watermark[..], &payload], 0).unwrap();
    }
    router.send_multipart([id, b"", &[0xff; 8][..], b""], 0).unwrap();
}

/// The engine entry of a config or `/register` body.
fn engine_json(
    name: &str,
    http: &TestEngine,
    replay: Value,
    dp: u32,
    topic: Option<&str>,
) -> Value {
    let mut e = json!({"name": name, "url": format!("http://127.0.0.1:{}", http.port),
        "dialect": "vllm", "events": "bind", "dp_size": dp, "replay": replay,
        "block_size": B, "model": "m"});
    if let Some(t) = topic {
        e["topic"] = json!(t);
    }
    e
}

fn flags() -> Flags {
    Flags {
        http_server_port: 0,
        server_host: "127.0.0.1".into(),
        etcd_addr: String::new(),
        ..Flags::default()
    }
}

/// The stream of `name` rank `rank` once it is live.
fn live(svc: &Service, name: &str, rank: u32) -> Value {
    eventually(&format!("{name}/{rank} to be live"), || {
        let r = report(svc);
        let s = r["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["instance_name"] == name && s["dp_rank"] == rank);
        match s {
            Some(s) if s["phase"] == "live" => Ok(s.clone()),
            other => Err(format!("{other:?}")),
        }
    })
}

/// Waits until `name`/`rank` credits exactly `device` tokens of `tokens`.
fn credits(svc: &Service, name: &str, rank: u32, tokens: &[i32], device: u64) {
    eventually(&format!("{name}/{rank} to credit {device} tokens"), || {
        let got = hits(svc, name, rank, tokens)?;
        (got == (device, 0)).then_some(()).ok_or(format!("{got:?}"))
    })
}

/// The bind counters of the streams report, once `unknown_messages` reaches `n`.
fn unknown_reaches(svc: &Service, n: u64) -> Value {
    eventually(&format!("{n} unknown messages"), || {
        let bind = report(svc)["bind"].clone();
        (bind["unknown_messages"] == n).then_some(bind.clone()).ok_or(bind.to_string())
    })
}

fn metric(svc: &Service, name: &str) -> Option<f64> {
    let text = http(svc.http_addr(), "GET", "/metrics", &[], b"").body;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn connected_engines_are_credited_per_rank_and_kept_apart_by_topic() {
    let port = free_ports(2);
    let (http_a, http_b) = (TestEngine::start(), TestEngine::start());
    let ctx = zmq::Context::new();
    let topic_a = format!("kv@127.0.0.1:{}@m", http_a.port);
    let a0 = Rank::connect(&ctx, port, &topic_a, 0);
    let a1 = Rank::connect(&ctx, port + 1, &topic_a, 1);
    let b0 = Rank::connect(&ctx, port, "engine-b", 0);
    // Published before kvdir listens: only the history replay brings it.
    let early = prompt(1, 2);
    a0.store(&early);
    let config = json!({
        "kv_events_bind": {"endpoint": format!("tcp://127.0.0.1:{port}"), "ranks": 2,
                           "topic": "kv@{host}:{port}@{model}"},
        "engines": [
            // Each rank answers on its own ROUTER: both are listed.
            engine_json("a", &http_a, json!([a0.replay, a1.replay]), 2, None),
            engine_json("b", &http_b, json!(b0.replay), 1, Some("engine-b")),
        ],
        "engine_poll_interval_ms": 100,
    });
    let directory = parse_config_file(&config.to_string()).expect("a valid config");
    let svc = Service::start(flags(), Some(directory)).expect("kvdir starts");

    let s = live(&svc, "a", 1);
    assert_eq!(s["endpoint"], format!("bind tcp://127.0.0.1:{} topic {topic_a:?}", port + 1));
    assert_eq!(s["replay_endpoint"], a1.replay.as_str());
    live(&svc, "a", 0);
    live(&svc, "b", 0);
    credits(&svc, "a", 0, &early, 2 * B as u64);
    for r in [&a0, &a1, &b0] {
        r.wait_subscribed();
    }

    let (x, y, z) = (prompt(100, 4), prompt(200, 2), prompt(300, 3));
    a0.store(&x);
    a1.store(&y);
    b0.store(&z);
    credits(&svc, "a", 0, &x, 4 * B as u64);
    credits(&svc, "a", 1, &y, 2 * B as u64);
    credits(&svc, "b", 0, &z, 3 * B as u64);
    // Each block is credited only where it was published.
    assert_eq!(hits(&svc, "a", 1, &x), Ok((0, 0)));
    assert_eq!(hits(&svc, "a", 0, &y), Ok((0, 0)));
    assert_eq!(hits(&svc, "b", 0, &x), Ok((0, 0)));
    assert_eq!(hits(&svc, "a", 0, &z), Ok((0, 0)));
    assert_eq!(report(&svc)["bind"]["unknown_messages"], 0);

    // A topic no engine has, and b's topic on a port of a rank b does not have.
    let stranger = Rank::connect(&ctx, port, "nobody", 0);
    let b_on_rank_1 = Rank::connect(&ctx, port + 1, "engine-b", 0);
    stranger.wait_subscribed();
    b_on_rank_1.wait_subscribed();
    let w = prompt(400, 2);
    stranger.store(&w);
    b_on_rank_1.store(&w);
    let bind = unknown_reaches(&svc, 2);
    let topics = bind["unknown_topics"].to_string();
    assert!(topics.contains("nobody") && topics.contains("engine-b\\\" (rank 1)"), "{topics}");
    assert_eq!(metric(&svc, "kvdir_bind_unknown_messages_total"), Some(2.0));
    for (name, rank) in [("a", 0), ("a", 1), ("b", 0)] {
        assert_eq!(hits(&svc, name, rank, &w), Ok((0, 0)), "{name}/{rank}");
        assert_eq!(live(&svc, name, rank)["decode_errors"], 0);
    }
    assert_eq!(hits(&svc, "a", 0, &x), Ok((4 * B as u64, 0)), "nothing else changed");
    assert!(metric(&svc, "kvdir_bind_messages_total") >= Some(3.0));
}

#[test]
fn a_registered_engine_connects_and_its_messages_are_unknown_once_unregistered() {
    let port = free_ports(1);
    let http_c = TestEngine::start();
    let ctx = zmq::Context::new();
    // The flag alone: one rank, llm-d's topic kv@{host}@{model}.
    let flags = Flags { kv_events_bind: Some(format!("tcp://127.0.0.1:{port}")), ..flags() };
    let svc = Service::start(flags, None).expect("kvdir starts");
    let c = Rank::connect(&ctx, port, "kv@127.0.0.1@m", 0);
    let post = |path: &str, body: &Value| {
        http(svc.http_addr(), "POST", path, &[], body.to_string().as_bytes())
    };
    let mut body = engine_json("c", &http_c, json!(c.replay), 1, None);
    body["dp_size"] = json!(2);
    let r = post("/register", &body);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("dp_size = 2 exceeds kv_events_bind.ranks = 1"), "{}", r.body);
    let r = post("/register", &engine_json("c", &http_c, json!(c.replay), 1, None));
    assert_eq!(r.status, 200, "{}", r.body);

    live(&svc, "c", 0);
    c.wait_subscribed();
    let x = prompt(10, 3);
    c.store(&x);
    credits(&svc, "c", 0, &x, 3 * B as u64);
    assert_eq!(report(&svc)["bind"]["unknown_messages"], 0);

    let r = post("/unregister", &json!({"instance_id": "c"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let removed = &r.json()["removed"][0];
    assert_eq!(removed["endpoint"], format!("bind tcp://127.0.0.1:{port}"), "{removed}");
    eventually("c's stream to stop", || {
        let n = report(&svc)["streams"].as_array().unwrap().len();
        (n == 0).then_some(()).ok_or(format!("{n} streams"))
    });
    c.store(&prompt(50, 1));
    unknown_reaches(&svc, 1);
}

#[test]
fn discovered_instances_publish_to_the_bind_endpoint_with_events_bind() {
    let etcd = etcd_endpoint();
    let port = free_ports(1);
    let http_port = free_http_port(1);
    let name = format!("127.0.0.1:{http_port}");
    let ctx = zmq::Context::new();
    // Its snapshot port derives from its name as for any discovered instance.
    let replay = format!("tcp://127.0.0.1:{}", http_port + 30_000);
    let engine = Rank::xllm(&ctx, port, &format!("kv@{name}"), &replay);
    let early = prompt(1, 2);
    engine.store(&early);
    let extra = json!({
        "kv_events_bind": {"endpoint": format!("tcp://127.0.0.1:{port}"), "topic": "kv@{host}:{port}"},
        "discovery": {"enabled": true, "block_size": B, "events": "bind", "refresh_interval_ms": 100},
    });
    let svc = discovery_service(&etcd.endpoint, "e2e-bind", extra, Flags::default());
    let v =
        json!({"name": name, "rpc_address": "", "type": 0, "dp_size": 1, "incarnation_id": "x"});
    etcd_put(&etcd, &format!("/e2e-bind/XLLM:DEFAULT:{name}"), &v);

    let s = live(&svc, &name, 0);
    assert_eq!(s["replay"], "snapshot");
    assert_eq!(s["endpoint"], format!("bind tcp://127.0.0.1:{port} topic \"kv@{name}\""));
    credits(&svc, &name, 0, &early, 2 * B as u64);
    engine.wait_subscribed();
    let x = prompt(100, 3);
    engine.store(&x);
    credits(&svc, &name, 0, &x, 3 * B as u64);
    assert_eq!(report(&svc)["bind"]["unknown_messages"], 0);
}
