//! kvdir's own listener on the bind endpoint's ports (`tcp://IP:PORT`), on loopback: an
//! engine's publisher that goes away and connects again is read again; peers that send
//! garbage, the wrong socket type or a frame over the limit are disconnected while the
//! engines' messages go on; hundreds of publishers connect at once and each is read. (A port
//! libzmq binds, on an interface name, is read in `stream::pool`'s unit tests: this machine's
//! libzmq binds no name.) What a user sees: credits, the bind counters, the connections kvdir
//! closes, the connections it counts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::*;

/// A config with one engine `a` (rank 0 on `port`) publishing under `topic`.
fn one_engine(endpoint: &str, http: &TestEngine, a: &Rank) -> Value {
    json!({
        "kv_events_bind": {"endpoint": endpoint, "topic": "kv@{host}:{port}@{model}"},
        "engines": [engine_json("a", http, json!(a.replay), 1, None)],
        "engine_poll_interval_ms": 100,
    })
}

fn start(config: &Value) -> Service {
    let directory = parse_config_file(&config.to_string()).expect("a valid config");
    Service::start(flags(), Some(directory)).expect("kvdir starts")
}

/// Sends `bytes` on a fresh connection to `port` and waits until kvdir closes it; what kvdir
/// sent before closing.
fn refused(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    s.write_all(bytes).unwrap();
    let mut got = Vec::new();
    eventually("kvdir to close the connection", || {
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => Ok(()),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                Err(format!("{} bytes so far", got.len()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    });
    got
}

/// Waits until the streams report shows `n` engine connections on the bind ports.
fn connections(svc: &Service, n: u64) {
    eventually(&format!("{n} connections"), || {
        let bind = report(svc)["bind"].clone();
        (bind["connections"] == n).then_some(()).ok_or(bind.to_string())
    })
}

/// A ZMTP 3.0 NULL greeting (as a publisher's) and a READY naming `socket_type`.
fn handshake(socket_type: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    (b[0], b[9], b[10]) = (0xFF, 0x7F, 3);
    b[12..16].copy_from_slice(b"NULL");
    let body = [b"\x05READY\x0bSocket-Type", &(socket_type.len() as u32).to_be_bytes()[..]];
    let size = body.iter().map(|p| p.len()).sum::<usize>() + socket_type.len();
    b.extend_from_slice(&[0x04, size as u8]);
    body.iter().for_each(|p| b.extend_from_slice(p));
    b.extend_from_slice(socket_type);
    b
}

#[test]
fn a_publisher_that_reconnects_is_read_again_on_its_new_connection() {
    let port = free_ports(1);
    let http_a = TestEngine::start();
    let ctx = zmq::Context::new();
    let topic = format!("kv@127.0.0.1:{}@m", http_a.port);
    let mut a = Rank::connect(&ctx, port, &topic, 0);
    let svc = start(&one_engine(&format!("tcp://127.0.0.1:{port}"), &http_a, &a));
    live(&svc, "a", 0);
    a.wait_subscribed();
    let x = prompt(100, 2);
    a.store(&x);
    credits(&svc, "a", 0, &x, 2 * B as u64);

    for round in 0..3 {
        // The engine's publisher goes away (its connection closes) and a new one connects.
        let again = ctx.socket(zmq::XPUB).unwrap();
        again.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
        drop(std::mem::replace(&mut a.publisher, again));
        a.wait_subscribed();
        let y = prompt(200 + 10 * round, 3);
        a.store(&y);
        credits(&svc, "a", 0, &y, 3 * B as u64);
    }
    let s = live(&svc, "a", 0);
    assert_eq!((s["gaps"].as_u64(), s["decode_errors"].as_u64()), (Some(0), Some(0)), "{s}");
    connections(&svc, 1); // the old ones are closed
    assert_eq!(report(&svc)["bind"]["unknown_messages"], 0);
}

#[test]
fn peers_that_send_garbage_are_disconnected_and_the_engine_goes_on() {
    let port = free_ports(1);
    let http_a = TestEngine::start();
    let ctx = zmq::Context::new();
    let a = Rank::connect(&ctx, port, &format!("kv@127.0.0.1:{}@m", http_a.port), 0);
    let svc = start(&one_engine(&format!("tcp://127.0.0.1:{port}"), &http_a, &a));
    live(&svc, "a", 0);
    a.wait_subscribed();

    // kvdir greets first (a SUB's READY), then drops a peer that is no ZMTP publisher.
    let sent = refused(port, b"GET / HTTP/1.1\r\nHost: kvdir\r\n\r\n");
    assert_eq!(sent.first(), Some(&0xFF), "kvdir's ZMTP greeting: {sent:?}");
    assert!(sent.windows(3).any(|w| w == b"SUB"), "its READY names SUB: {sent:?}");
    refused(port, &handshake(b"ROUTER"));
    // A publisher whose first message holds a frame over the limit (max_message_bytes).
    let mut big = handshake(b"PUB");
    big.extend_from_slice(&[0x02]);
    big.extend_from_slice(&(1u64 << 40).to_be_bytes());
    refused(port, &big);
    // A connection that greets and stops half-way through a frame stays open: it may go on.
    let mut partial = TcpStream::connect(("127.0.0.1", port)).unwrap();
    partial.write_all(&handshake(b"PUB")[..70]).unwrap();

    connections(&svc, 2); // the engine's and the partial one
    let x = prompt(300, 4);
    a.store(&x);
    credits(&svc, "a", 0, &x, 4 * B as u64);
    let bind = report(&svc)["bind"].clone();
    assert_eq!((bind["unknown_messages"].as_u64(), bind["messages"].as_u64()), (Some(0), Some(1)));
    assert_eq!(live(&svc, "a", 0)["decode_errors"], 0);
}

/// A publisher under `topic` connected to `port`, with nothing behind it.
fn bare_publisher(ctx: &zmq::Context, port: u16) -> zmq::Socket {
    let p = ctx.socket(zmq::XPUB).unwrap();
    p.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    p
}

#[test]
fn hundreds_of_publishers_connect_at_once_and_each_is_read() {
    const PUBLISHERS: usize = 200;
    let port = free_ports(1);
    let http_a = TestEngine::start();
    let ctx = zmq::Context::new();
    let a = Rank::connect(&ctx, port, &format!("kv@127.0.0.1:{}@m", http_a.port), 0);
    // Connected before kvdir listens: libzmq retries, and they arrive together.
    let strangers: Vec<zmq::Socket> = (0..PUBLISHERS).map(|_| bare_publisher(&ctx, port)).collect();
    let svc = start(&one_engine(&format!("tcp://127.0.0.1:{port}"), &http_a, &a));
    live(&svc, "a", 0);
    a.wait_subscribed();
    for (i, s) in strangers.iter().enumerate() {
        eventually("kvdir's subscription", || match s.recv_bytes(zmq::DONTWAIT) {
            Ok(m) if m == [1] => Ok(()),
            other => Err(format!("{other:?}")),
        });
        let frames = encode_live(format!("stranger-{i}").as_bytes(), 0, batch(Vec::new(), 0));
        s.send_multipart(frames, 0).unwrap();
    }
    let x = prompt(50, 2);
    a.store(&x);
    credits(&svc, "a", 0, &x, 2 * B as u64);
    let bind = unknown_reaches(&svc, PUBLISHERS as u64);
    assert_eq!(bind["messages"], 1, "{bind}");
    assert_eq!(bind["connections"], PUBLISHERS + 1, "{bind}");
    drop(strangers);
    connections(&svc, 1);
    assert_eq!(super::metric(&svc, "kvdir_bind_connections"), Some(1.0));
    assert_eq!(bind["unknown_topics"].as_array().map(Vec::len), Some(16), "{bind}");
}
