//! The late live copy of a replayed batch against a restarted publisher (issue 36), over real
//! ZeroMQ with a hand-driven vLLM-style publisher: the test decides when each live batch goes
//! out, so the replay can answer batch 0 before its live copy arrives, as under load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{encode_batch, encode_history_end, encode_history_reply, encode_live, Tier};
use kvdir_testkit::eventually;
use serde_json::{json, Value};

use crate::common::*;

const TOPIC: &[u8] = b"kv@copies";

/// A publisher's replay history: `(seq, payload)` as sent live.
type History = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A vLLM-like publisher on ephemeral loopback ports: an XPUB (which shows kvdir's
/// subscription) and a ROUTER answering history replays from a thread.
struct Publisher {
    xpub: zmq::Socket,
    event: String,
    replay: String,
    history: History,
    /// The `start_seq` of every replay request answered.
    asked: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Publisher {
    fn start() -> Publisher {
        let (xpub, router, event, replay) = loopback_pair();
        let (history, asked) = (History::default(), Arc::new(Mutex::new(Vec::new())));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, a, s) = (Arc::clone(&history), Arc::clone(&asked), Arc::clone(&stop));
        let server = std::thread::spawn(move || serve_history(&router, &h, &a, &s));
        Publisher { xpub, event, replay, history, asked, stop, server: Some(server) }
    }

    fn stream(&self, name: &str) -> Value {
        json!({"instance_name": name, "dp_rank": 0, "block_size": B, "endpoint": self.event,
               "replay_endpoint": self.replay, "topic": "kv@copies", "replay": "history"})
    }

    /// Waits for kvdir's subscription: live batches sent from then on reach it.
    fn subscribed(&self) {
        wait_subscribed(&self.xpub, TOPIC, &self.event);
    }

    /// Batch `seq` enters the history without going out live (yet).
    fn buffer(&self, seq: u64, payload: &[u8]) {
        self.history.lock().unwrap().push((seq, payload.to_vec()));
    }

    fn send_live(&self, seq: u64, payload: &[u8]) {
        self.xpub.send_multipart(encode_live(TOPIC, seq, payload.to_vec()), 0).unwrap();
    }

    /// A restart: the process numbers from 0 again with an empty history.
    fn restart(&self) {
        self.history.lock().unwrap().clear();
    }

    fn asked(&self) -> Vec<u64> {
        self.asked.lock().unwrap().clone()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

/// A publisher's XPUB and ROUTER on ephemeral loopback ports, with their endpoints.
pub(super) fn loopback_pair() -> (zmq::Socket, zmq::Socket, String, String) {
    let ctx = zmq::Context::new();
    let xpub = ctx.socket(zmq::XPUB).unwrap();
    xpub.bind("tcp://127.0.0.1:0").unwrap();
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.bind("tcp://127.0.0.1:0").unwrap();
    let event = xpub.get_last_endpoint().unwrap().unwrap();
    let replay = router.get_last_endpoint().unwrap().unwrap();
    (xpub, router, event, replay)
}

/// Waits until `xpub` (at `endpoint`) sees kvdir subscribe to `topic`: live batches sent from
/// then on reach it.
pub(super) fn wait_subscribed(xpub: &zmq::Socket, topic: &[u8], endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if xpub.poll(zmq::POLLIN, 100).unwrap() > 0 {
            let sub = xpub.recv_bytes(0).unwrap();
            if sub.first() == Some(&1) && &sub[1..] == topic {
                return;
            }
        }
    }
    panic!("kvdir never subscribed to {endpoint}");
}

/// Answers `[identity, "", start_seq]` with the buffered batches from `start_seq` on, then the
/// end marker, as vLLM's `ZmqEventPublisher` does.
fn serve_history(
    router: &zmq::Socket,
    history: &History,
    asked: &Mutex<Vec<u64>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        if router.poll(zmq::POLLIN, 50).unwrap() == 0 {
            continue;
        }
        let request = router.recv_multipart(0).unwrap();
        let [identity, _, start] = &request[..] else { continue };
        let start = u64::from_be_bytes(start[..].try_into().unwrap());
        asked.lock().unwrap().push(start);
        let batches: Vec<_> =
            history.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
        let replies = batches.into_iter().map(|(s, p)| encode_history_reply(TOPIC, s, p));
        for frames in replies.chain([encode_history_end()]) {
            let msg = std::iter::once(identity.clone()).chain(frames);
            router.send_multipart(msg, 0).unwrap();
        }
    }
}

/// A vLLM batch stamped `ts` storing `tokens` as blocks hashed from `first_hash` on.
fn stored(ts: f64, tokens: &[i32], first_hash: u64) -> Vec<u8> {
    let hashes = (first_hash..).take(tokens.len() / B as usize).map(WireHash::Uint).collect();
    let store = StoredRecord::new(hashes, None, tokens.to_vec(), B, Tier::Device);
    let rec =
        BatchRecord { timestamp: ts, events: vec![EventRecord::Stored(store)], dp_rank: None };
    encode_batch(&rec, BatchForm::Map, EventForm::Positional)
}

/// The stream's report once `done` holds of it.
pub(super) fn stream_when(
    svc: &kvdir_service::Service,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    eventually(what, || {
        let s = report(svc)["streams"][0].clone();
        if done(&s) {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
}

/// kvdir started before the publisher's first live batch reaches it: the replay answers batch
/// 0 (stamped 1.0, storing `a`), and the stream is live at 1.
fn replayed_zero(name: &str, a: &[i32]) -> (Publisher, kvdir_service::Service, Vec<u8>) {
    let p = Publisher::start();
    let zero = stored(1.0, a, 100);
    p.buffer(0, &zero);
    let svc = service(vec![p.stream(name)], json!({}));
    p.subscribed();
    stream_when(&svc, "batch 0 replayed", |s| s["phase"] == "live" && s["replayed_batches"] == 1);
    assert_eq!(hits(&svc, name, 0, a), Ok((32, 0)));
    (p, svc, zero)
}

#[test]
fn the_late_live_copy_of_a_replayed_batch_0_is_dropped_and_the_stream_stays_synchronized() {
    let a = prompt(1, 2);
    let (p, svc, zero) = replayed_zero("late-copy", &a);
    p.send_live(0, &zero);
    let b = prompt(500, 1);
    let one = stored(2.0, &b, 200);
    p.buffer(1, &one);
    p.send_live(1, &one);
    eventually("batch 1 applied", || match hits(&svc, "late-copy", 0, &b) {
        Ok((16, 0)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let s = report(&svc)["streams"][0].clone();
    assert_eq!(s["duplicate_batches"], 1, "batch 0 came again: {s}");
    assert_eq!(
        (&s["gaps"], &s["recoveries"], &s["last_fault"]),
        (&json!(0), &json!(0), &Value::Null)
    );
    assert_eq!((&s["phase"], p.asked()), (&json!("live"), vec![0]), "one replay: {s}");
    assert_eq!(hits(&svc, "late-copy", 0, &a), Ok((32, 0)));
}

#[test]
fn a_restarted_publishers_different_batch_0_is_still_a_restart() {
    let a = prompt(1, 2);
    let (p, svc, _) = replayed_zero("restarted", &a);
    p.restart();
    let c = prompt(900, 2);
    let new_zero = stored(7.0, &c, 300);
    p.buffer(0, &new_zero);
    p.send_live(0, &new_zero);
    let s = stream_when(&svc, "the restart recovered", |s| {
        s["recoveries"] == 1 && s["phase"] == "live"
    });
    let fault = s["last_fault"].as_str().unwrap_or_default();
    assert_eq!(fault, "sequence went back from 0 to 0: publisher restarted", "{s}");
    assert_eq!(p.asked(), [0, 0], "the restarted publisher's history from its start");
    assert_eq!(hits(&svc, "restarted", 0, &c), Ok((32, 0)));
    assert_eq!(hits(&svc, "restarted", 0, &a), Ok((0, 0)), "the old process's blocks are gone");
}
