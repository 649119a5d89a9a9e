//! The pool on real sockets: a stream read through an in-process SUB, and a bound stream fed
//! by its rank's port, a libzmq SUB or kvdir's own listener, from a libzmq publisher on
//! loopback.

use std::net::SocketAddr;
use std::time::Duration;

use kvdir::config::{BindConfig, Limits, ReplayKind, StreamSpec, BIND_ENDPOINT};
use kvdir::index::StreamLabel;
use kvdir::stream::StreamPhase;
use kvdir::wire::record::{BatchForm, BatchRecord, EventForm};
use kvdir::wire::{encode_batch, encode_live, encode_snapshot_end, encode_snapshot_reply};

use super::*;
use crate::directory::Directory;
use crate::stream::sockets::ZmqContext;
use crate::stream::worker::WorkerStatus;
use crate::stream::StreamShared;

/// A stream `inproc` (rank 0) at `endpoint` under `topic`, replayed by snapshot at `replay`,
/// and its status.
fn stream(
    zmq: &ZmqContext,
    endpoint: &str,
    topic: &str,
    replay: &str,
) -> (NewStream, Arc<Mutex<WorkerStatus>>) {
    let spec = StreamSpec {
        instance_name: "inproc".into(),
        dp_rank: 0,
        block_size: 4,
        endpoint: endpoint.into(),
        replay_endpoint: replay.into(),
        topic: topic.into(),
        hash_seed: 1024,
        model: String::new(),
        salt: String::new(),
        replay: ReplayKind::Snapshot,
    };
    let limits = Limits::default();
    let directory = Directory::default();
    let label = StreamLabel { instance_name: "inproc".into(), ..StreamLabel::default() };
    let writer = directory.add_stream(spec.index_config(&limits), label).unwrap();
    let shared = Arc::new(StreamShared::new("inproc", 0, writer));
    let status = Arc::new(Mutex::new(Default::default()));
    let zmq = zmq.clone();
    let ctx = WorkerCtx { spec, limits, shared, status: Arc::clone(&status), zmq };
    let exited = Box::new(|reason: String| panic!("the stream failed: {reason}"));
    (NewStream { ctx, exited }, status)
}

/// An empty batch of rank 0.
fn empty() -> Vec<u8> {
    let empty = BatchRecord { timestamp: 0.0, events: Vec::new(), dp_rank: Some(0) };
    encode_batch(&empty, BatchForm::Array, EventForm::Map)
}

/// Answers the stream's snapshot request on `router` (an empty state) until it is live.
fn synchronize(router: &zmq::Socket, status: &Mutex<WorkerStatus>) {
    kvdir_testkit::eventually("the stream to be live", || {
        if let Ok(request) = router.recv_multipart(zmq::DONTWAIT) {
            for frames in [encode_snapshot_reply(0, empty()), encode_snapshot_end()] {
                let reply = std::iter::once(request[0].clone()).chain(frames);
                router.send_multipart(reply, 0).unwrap();
            }
        }
        let s = lock(status).clone();
        match (s.connected, s.phase) {
            (true, StreamPhase::Live) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    });
}

/// A stream whose live endpoint is in process (the bind endpoint's fan-out) has no ZMTP
/// handshake: it counts as connected once connected, and synchronizes by snapshot.
#[test]
fn an_inproc_stream_is_connected_at_once_and_synchronizes() {
    let zmq = ZmqContext::new(16);
    let publisher = zmq.socket(zmq::PUB).unwrap();
    publisher.bind("inproc://pool-test-live").unwrap();
    let router = zmq.socket(zmq::ROUTER).unwrap();
    router.bind("inproc://pool-test-replay").unwrap();
    let (new, status) = stream(&zmq, "inproc://pool-test-live", "", "inproc://pool-test-replay");
    let pool = IoPool::start(1, 1).unwrap();
    pool.add(1, new);
    synchronize(&router, &status);
    assert_eq!(pool.stats().io_threads[0].streams, 1);
    pool.stop_and_join();
    assert_eq!(pool.stats().io_threads[0].streams, 0, "the thread's streams end with it");
}

/// Rank 0's port, kvdir's listener or a libzmq SUB bound on loopback, and its address.
fn port(zmq: &ZmqContext, listener: bool) -> (PortSocket, SocketAddr) {
    if listener {
        let addr = "127.0.0.1:0".parse().unwrap();
        let l = Listener::bind(addr, 1 << 20, Duration::from_secs(3)).unwrap();
        let addr = l.local_addr().unwrap();
        return (PortSocket::Tcp(l), addr);
    }
    let sub = zmq.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.bind("tcp://127.0.0.1:*").unwrap();
    let endpoint = sub.get_last_endpoint().unwrap().unwrap();
    let addr = endpoint.strip_prefix("tcp://").unwrap().parse().unwrap();
    (PortSocket::Zmq(sub), addr)
}

/// Waits until `publisher` (an XPUB) sees the port's subscription.
fn subscribed(publisher: &zmq::Socket) {
    kvdir_testkit::eventually("the port's subscription", || {
        match publisher.recv_bytes(zmq::DONTWAIT) {
            Ok(m) if m == [1] => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// Both kinds of port hand an engine's messages to the bound stream its topic names, count
/// a message whose topic names none as unknown, and after the stream restarts (a new worker
/// under the same key) hand them to the new one.
#[test]
fn a_bound_port_hands_each_message_to_the_stream_its_topic_names() {
    for listener in [false, true] {
        let zmq = ZmqContext::new(64);
        let routes = BindRoutes::new(BindConfig::with_endpoint("tcp://127.0.0.1:1").unwrap());
        let keyed = routes.add("engine", 0).unwrap();
        let replay = format!("inproc://pool-test-bound-replay-{listener}");
        let router = zmq.socket(zmq::ROUTER).unwrap();
        router.bind(&replay).unwrap();
        let (new, status) = stream(&zmq, BIND_ENDPOINT, &keyed, &replay);
        let pool = IoPool::start(1, 1).unwrap();
        let (socket, addr) = port(&zmq, listener);
        pool.attach_port(0, socket, routes.clone());
        let ticket = pool.add(1, new);
        synchronize(&router, &status);

        let publisher = zmq.socket(zmq::XPUB).unwrap();
        publisher.connect(&format!("tcp://{addr}")).unwrap();
        subscribed(&publisher);
        for seq in 0..3 {
            publisher.send_multipart(encode_live(b"engine", seq, empty()), 0).unwrap();
        }
        publisher.send_multipart(encode_live(b"stranger", 0, empty()), 0).unwrap();
        kvdir_testkit::eventually("every message to be read", || {
            let (r, s) = (routes.report(), lock(&status).clone());
            match (r.messages, r.unknown_messages, s.messages, s.stats.gaps) {
                (3, 1, 3, 0) => Ok(()),
                seen => Err(format!("listener {listener}: {seen:?}")),
            }
        });

        pool.remove(ticket);
        let (again, status) = stream(&zmq, BIND_ENDPOINT, &keyed, &replay);
        pool.add(2, again);
        synchronize(&router, &status);
        for seq in 0..2 {
            publisher.send_multipart(encode_live(b"engine", seq, empty()), 0).unwrap();
        }
        kvdir_testkit::eventually("the restarted stream to read them", || {
            match (routes.report().messages, lock(&status).messages) {
                (5, 2) => Ok(()),
                seen => Err(format!("listener {listener}: {seen:?}")),
            }
        });
        pool.stop_and_join();
    }
}
