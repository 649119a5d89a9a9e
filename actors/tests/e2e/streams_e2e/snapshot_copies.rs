//! The late live copy of a batch an xLLM snapshot already holds, over real ZeroMQ with a
//! hand-driven publisher on `tcp://127.0.0.1` (kvdir's own ZMTP reader): the test sends batch
//! 0 live only after kvdir installed the snapshot that covers it, as happens under load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvdir::wire::record::{BatchForm, BatchRecord, EventForm, EventRecord, StoredRecord, WireHash};
use kvdir::wire::{encode_batch, encode_live, encode_snapshot_end, encode_snapshot_reply, Tier};
use serde_json::{json, Value};

use super::copies::{loopback_pair, stream_when, wait_subscribed};
use crate::common::*;

const TOPIC: &[u8] = b"kv@snap";

/// The publisher's state: `(watermark, blocks stored so far as one batch)`.
type State = Arc<Mutex<(u64, Vec<u8>)>>;

/// An xLLM-like publisher on ephemeral loopback ports: an XPUB (which shows kvdir's
/// subscription) and a ROUTER answering snapshot requests with its state from a thread.
struct Publisher {
    xpub: zmq::Socket,
    event: String,
    replay: String,
    state: State,
    asked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Publisher {
    fn start(watermark: u64, state: Vec<u8>) -> Publisher {
        let (xpub, router, event, replay) = loopback_pair();
        let state = Arc::new(Mutex::new((watermark, state)));
        let (asked, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (s, a, st) = (Arc::clone(&state), Arc::clone(&asked), Arc::clone(&stop));
        let server = std::thread::spawn(move || serve_snapshots(&router, &s, &a, &st));
        Publisher { xpub, event, replay, state, asked, stop, server: Some(server) }
    }

    fn stream(&self, name: &str) -> Value {
        json!({"instance_name": name, "dp_rank": 0, "block_size": B, "endpoint": self.event,
               "replay_endpoint": self.replay, "topic": "kv@snap", "replay": "snapshot"})
    }

    /// Waits for kvdir's subscription: live batches sent from then on reach it.
    fn subscribed(&self) {
        wait_subscribed(&self.xpub, TOPIC, &self.event);
    }

    fn send_live(&self, seq: u64, payload: &[u8]) {
        self.xpub.send_multipart(encode_live(TOPIC, seq, payload.to_vec()), 0).unwrap();
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

/// Answers every request with the state as one batch at its watermark, then the terminator.
fn serve_snapshots(router: &zmq::Socket, state: &State, asked: &AtomicU64, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if router.poll(zmq::POLLIN, 50).unwrap() == 0 {
            continue;
        }
        let request = router.recv_multipart(0).unwrap();
        asked.fetch_add(1, Ordering::Relaxed);
        let (watermark, payload) = state.lock().unwrap().clone();
        for frames in [encode_snapshot_reply(watermark, payload), encode_snapshot_end()] {
            let msg = std::iter::once(request[0].clone()).chain(frames);
            router.send_multipart(msg, 0).unwrap();
        }
    }
}

/// An xLLM batch (rank 0) storing `tokens` as blocks hashed from `first_hash` on.
fn stored(tokens: &[i32], first_hash: u64) -> Vec<u8> {
    let hashes = (first_hash..).take(tokens.len() / B as usize).map(WireHash::Uint).collect();
    let store = StoredRecord::new(hashes, None, tokens.to_vec(), B, Tier::Device);
    let rec =
        BatchRecord { timestamp: 0.0, events: vec![EventRecord::Stored(store)], dp_rank: Some(0) };
    encode_batch(&rec, BatchForm::Array, EventForm::Map)
}

#[test]
fn a_snapshots_late_live_0_on_the_connection_the_sync_began_on_is_a_copy_not_a_restart() {
    // Issue 36, run C: the snapshot covered batch 0 (watermark 1) and live 0 came after it on
    // the same connection; it was taken for a restarted publisher and cost a recovery.
    let a = prompt(1, 2);
    let zero = stored(&a, 100);
    let p = Publisher::start(1, zero.clone());
    let svc = service(vec![p.stream("late-zero")], json!({}));
    p.subscribed();
    stream_when(&svc, "the snapshot installed", |s| s["phase"] == "live");
    assert_eq!(hits(&svc, "late-zero", 0, &a), Ok((32, 0)));
    p.send_live(0, &zero);
    let b = prompt(500, 1);
    let one = stored(&b, 200);
    *p.state.lock().unwrap() = (2, [zero, one.clone()].concat()); // not read again: one sync
    p.send_live(1, &one);
    eventually_hits(&svc, "late-zero", &b, (16, 0));
    let s = report(&svc)["streams"][0].clone();
    assert_eq!(s["duplicate_batches"], 1, "batch 0 came again: {s}");
    assert_eq!((&s["gaps"], &s["recoveries"]), (&json!(0), &json!(0)), "{s}");
    assert_eq!((&s["last_fault"], &s["phase"]), (&Value::Null, &json!("live")), "{s}");
    assert_eq!(p.asked.load(Ordering::Relaxed), 1, "one snapshot: {s}");
    assert_eq!(hits(&svc, "late-zero", 0, &a), Ok((32, 0)));
}

#[test]
fn a_snapshot_streams_sequence_that_goes_back_after_a_live_batch_is_still_a_restart() {
    let a = prompt(1, 2);
    let p = Publisher::start(3, stored(&a, 100));
    let svc = service(vec![p.stream("went-back")], json!({}));
    p.subscribed();
    stream_when(&svc, "the snapshot installed", |s| s["phase"] == "live");
    let b = prompt(500, 1);
    p.send_live(3, &stored(&b, 200));
    eventually_hits(&svc, "went-back", &b, (16, 0));
    let c = prompt(900, 2);
    *p.state.lock().unwrap() = (1, stored(&c, 300)); // what the "new numbering" holds
    p.send_live(0, &stored(&c, 300));
    let s = stream_when(&svc, "the restart recovered", |s| {
        s["recoveries"] == 1 && s["phase"] == "live"
    });
    let fault = s["last_fault"].as_str().unwrap_or_default();
    assert_eq!(fault, "sequence went back from 3 to 0: publisher restarted", "{s}");
    assert_eq!(hits(&svc, "went-back", 0, &c), Ok((32, 0)));
    assert_eq!(hits(&svc, "went-back", 0, &a), Ok((0, 0)), "the old state's blocks are gone");
}

/// Waits until `tokens` are credited `want` on rank 0 of `name`.
fn eventually_hits(svc: &kvdir_service::Service, name: &str, tokens: &[i32], want: (u64, u64)) {
    kvdir_testkit::eventually("the batch applied", || match hits(svc, name, 0, tokens) {
        Ok(got) if got == want => Ok(()),
        other => Err(format!("{other:?}")),
    });
}
