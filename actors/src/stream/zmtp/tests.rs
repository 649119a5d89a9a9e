//! [`Conn`] against real libzmq sockets on loopback: a PUB (handshake, subscription, messages
//! frame for frame, a frame over the limit, a publisher gone and back on the same port) and a
//! ROUTER (a request, its replies, no second request after the connection ends), and a PUB
//! with ZMTP heartbeats (its PINGs answered).

use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::{endpoint_addr, Conn, Step};

const TOKEN: Token = Token(7);

/// Drives `conn` until `want` says a step is the one awaited (or fails after 10 s); the
/// publisher is asked to `send` before each wait.
fn until(
    conn: &mut Conn,
    poll: &mut Poll,
    mut send: impl FnMut(),
    mut want: impl FnMut(&Step, &Conn) -> bool,
) -> Step {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = Events::with_capacity(8);
    loop {
        assert!(Instant::now() < deadline, "the awaited step never came");
        conn.begin_turn();
        loop {
            let step = conn.next(Instant::now(), poll.registry(), TOKEN);
            if want(&step, conn) {
                conn.end_turn();
                return step;
            }
            if step == Step::Idle {
                break;
            }
        }
        conn.end_turn();
        send();
        let wait = conn.deadline().map_or(Duration::from_millis(20), |at| {
            at.saturating_duration_since(Instant::now()).min(Duration::from_millis(20))
        });
        poll.poll(&mut events, Some(wait)).unwrap();
    }
}

fn frames(conn: &Conn) -> Vec<Vec<u8>> {
    conn.with_message(|parts| parts.iter().map(|p| p.to_vec()).collect())
}

#[test]
fn a_libzmq_publisher_is_subscribed_read_and_reconnected() {
    let ctx = zmq::Context::new();
    let publisher = ctx.socket(zmq::PUB).unwrap();
    publisher.bind("tcp://127.0.0.1:0").unwrap();
    let endpoint = publisher.get_last_endpoint().unwrap().unwrap();
    let addr = endpoint_addr(&endpoint).unwrap();
    assert_eq!(endpoint_addr("tcp://engine-0:5557"), None, "names go through libzmq");
    let mut poll = Poll::new().unwrap();
    let mut conn = Conn::sub(addr, b"kv", 1000, Duration::from_secs(3));
    let got = until(&mut conn, &mut poll, || {}, |s, _| *s == Step::Connected);
    assert_eq!(got, Step::Connected);

    // Until the subscription reaches the publisher its messages are dropped: send until one
    // comes. Another topic never does; frames arrive as sent (short, long, empty).
    let long = vec![9u8; 700];
    let sent = [b"kv".to_vec(), 5u64.to_be_bytes().to_vec(), long.clone(), Vec::new()];
    let mut seen = Vec::new();
    until(
        &mut conn,
        &mut poll,
        || {
            publisher.send_multipart([&b"other"[..], b"x"], 0).unwrap();
            publisher.send_multipart(&sent, 0).unwrap();
        },
        |s, c| {
            if *s == Step::Message {
                seen.push(frames(c));
            }
            !seen.is_empty()
        },
    );
    assert_eq!(seen[0], sent, "frame for frame, and only the subscribed topic");

    // A frame over the limit drops the connection (libzmq's ZMQ_MAXMSGSIZE did the same).
    publisher.send_multipart([&b"kv"[..], &vec![0u8; 1001]], 0).unwrap();
    let lost = until(&mut conn, &mut poll, || {}, |s, _| matches!(s, Step::Disconnected(_)));
    assert!(matches!(&lost, Step::Disconnected(r) if r.contains("1001 bytes")), "{lost:?}");
    until(&mut conn, &mut poll, || {}, |s, _| *s == Step::Connected);

    // The publisher goes away, and comes back on the same port.
    drop(publisher);
    until(&mut conn, &mut poll, || {}, |s, _| matches!(s, Step::Disconnected(_)));
    let publisher = ctx.socket(zmq::PUB).unwrap();
    publisher.bind(&endpoint).unwrap();
    until(&mut conn, &mut poll, || {}, |s, _| *s == Step::Connected);
    let again = [b"kv2".to_vec(), vec![1], vec![2]];
    let mut seen = Vec::new();
    until(
        &mut conn,
        &mut poll,
        || publisher.send_multipart(&again, 0).unwrap(),
        |s, c| {
            if *s == Step::Message {
                seen.push(frames(c));
            }
            !seen.is_empty()
        },
    );
    assert_eq!(seen[0], again, "subscribed again after the reconnect");
}

#[test]
fn a_libzmq_router_gets_one_request_and_its_replies_are_read() {
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.bind("tcp://127.0.0.1:0").unwrap();
    let addr = endpoint_addr(&router.get_last_endpoint().unwrap().unwrap()).unwrap();
    let mut poll = Poll::new().unwrap();
    let request = [&b""[..], &9u64.to_be_bytes()[..]];
    let timeout = Duration::from_secs(3);
    let mut conn =
        Conn::dealer(addr, &request, 1 << 20, timeout, (poll.registry(), TOKEN)).unwrap();
    until(&mut conn, &mut poll, || {}, |s, _| *s == Step::Connected);
    let got = kvdir_testkit::eventually("the request", || {
        router.recv_multipart(zmq::DONTWAIT).map_err(|e| e.to_string())
    });
    assert_eq!(got[1..], [Vec::new(), 9u64.to_be_bytes().to_vec()], "one request, as sent");
    let payload = vec![3u8; 100_000];
    for mark in [&b"a"[..], b"b"] {
        let reply = [got[0].as_slice(), b"", mark, &payload];
        router.send_multipart(reply, 0).unwrap();
    }
    let mut seen = Vec::new();
    until(
        &mut conn,
        &mut poll,
        || {},
        |s, c| {
            if *s == Step::Message {
                seen.push(frames(c));
            }
            seen.len() == 2
        },
    );
    assert_eq!(seen[1], [Vec::new(), b"b".to_vec(), payload.clone()]);

    // The ROUTER goes away: no new connection sends the request again.
    drop(router);
    until(&mut conn, &mut poll, || {}, |s, _| matches!(s, Step::Disconnected(_)));
    assert_eq!(conn.deadline(), None, "no reconnect after the request went out");
    let later = Instant::now() + Duration::from_secs(60);
    assert_eq!(conn.next(later, poll.registry(), TOKEN), Step::Idle, "nor ever after");
    assert_eq!(conn.deadline(), None);
}

#[test]
fn a_publishers_zmtp_heartbeats_are_answered_so_it_keeps_the_connection() {
    let ctx = zmq::Context::new();
    let publisher = ctx.socket(zmq::PUB).unwrap();
    // libzmq PINGs every 20 ms and drops a peer silent for 100 ms after a PING.
    publisher.set_heartbeat_ivl(20).unwrap();
    publisher.set_heartbeat_timeout(100).unwrap();
    publisher.bind("tcp://127.0.0.1:0").unwrap();
    let addr = endpoint_addr(&publisher.get_last_endpoint().unwrap().unwrap()).unwrap();
    let mut poll = Poll::new().unwrap();
    let mut conn = Conn::sub(addr, b"", 1000, Duration::from_secs(3));
    until(&mut conn, &mut poll, || {}, |s, _| *s == Step::Connected);
    // Ten heartbeat timeouts without a message: only the PONGs keep the connection.
    let quiet = Instant::now() + Duration::from_secs(1);
    let mut events = Events::with_capacity(8);
    while Instant::now() < quiet {
        conn.begin_turn();
        let step = conn.next(Instant::now(), poll.registry(), TOKEN);
        assert_eq!(step, Step::Idle, "the publisher must keep kvdir (PINGs answered)");
        conn.end_turn();
        poll.poll(&mut events, Some(Duration::from_millis(10))).unwrap();
    }
}
