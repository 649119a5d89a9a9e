//! No stale credit from a silent or half-dead publisher: TCP keepalive notices a publisher
//! whose host vanished without closing the connection (made to vanish by an nftables rule that
//! drops its port's packets: the test needs root and `nft`, and fails without them), and a
//! publisher that keeps sending live events but refuses every snapshot loses its credit after
//! a bounded number of resyncs.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::common::*;
use kvdir::stream::MAX_FAILED_RESYNCS;
use kvdir_sim::{Fault, SnapshotMode};
use serde_json::json;

#[test]
fn a_publisher_refusing_every_snapshot_loses_its_credit_while_live_events_flow() {
    let eng = engine("refuser", 1, 0);
    let svc = service(streams_of(&eng), json!({"resync_interval_ms": 100}));
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
    eng.faults(0, Fault::Snapshot(SnapshotMode::Refuse)).unwrap();
    let mut first = 100;
    let error = eventually("the stream to lose its credit", || {
        // Live events keep flowing (and keep applying) meanwhile.
        first += 10;
        eng.process(0, &prompt(first, 1)).map_err(|e| e.to_string())?;
        let m = entry(&query(&svc, &a), "refuser", 0).clone();
        match m.error {
            Some(e) if !m.synchronized && e.contains("periodic resyncs failed in a row") => Ok(e),
            other => Err(format!("synchronized {} error {other:?}", m.synchronized)),
        }
    });
    assert!(error.starts_with(&format!("{MAX_FAILED_RESYNCS} periodic resyncs")), "{error}");
    assert_eq!(entry(&query(&svc, &a), "refuser", 0).device_hit_tokens, 0, "no credit");

    // Once snapshots are answered again, the stream recovers by itself.
    eng.faults(0, Fault::Snapshot(SnapshotMode::Normal)).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
}

#[test]
fn a_publisher_host_that_vanishes_is_disconnected_by_keepalive_and_recovered() {
    let eng = engine("vanished", 1, 0);
    let event = eng.endpoints()[0].event.clone();
    let port: u16 = event.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    // Keepalive in 1 s steps: idle 1 s, then 3 probes 1 s apart.
    let svc = service(streams_of(&eng), json!({"publisher_timeout_ms": 2000}));
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));

    // The host "vanishes": no packet to or from its port passes any more (keepalive probes and
    // new connections included), and nothing on the wire says so.
    let wall = Firewall::drop_port(port);
    eventually("the vanished publisher to be seen as disconnected", || {
        let m = entry(&query(&svc, &a), "vanished", 0).clone();
        match m.error.as_deref() {
            Some(e) if !m.synchronized && e.contains("disconnected") => Ok(()),
            other => Err(format!("synchronized {} error {other:?}", m.synchronized)),
        }
    });
    assert_eq!(entry(&query(&svc, &a), "vanished", 0).device_hit_tokens, 0, "no credit");

    // The host is back: kvdir reconnects (a connect that hung is given up after the timeout)
    // and synchronizes again, with what the engine stored meanwhile.
    let b = prompt(100, 3);
    eng.process(0, &b).unwrap();
    drop(wall);
    assert_eq!(agrees(&svc, &eng, 0, &b), (48, 0));
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
}

/// An nftables table of its own that drops every TCP packet from or to `port` on this host
/// (both directions of a loopback connection pass the input hook); deleted when dropped.
struct Firewall {
    table: String,
}

impl Firewall {
    fn drop_port(port: u16) -> Firewall {
        let table = format!("kvdir_test_{}_{port}", std::process::id());
        let rules = format!(
            "table inet {table} {{\n chain input {{\n type filter hook input priority 0;\n \
             tcp sport {port} drop\n tcp dport {port} drop\n }}\n}}\n"
        );
        let out = std::process::Command::new("nft").args(["-f", "-"]).stdin_string(&rules);
        assert!(
            out.as_ref().is_ok_and(|o| o.status.success()),
            "cannot drop port {port} with nftables: {out:?}; this test makes a host vanish \
             with a firewall rule: run it as root with nft installed (apt-get install nftables)"
        );
        Firewall { table }
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// Runs a command with `input` on its standard input.
trait StdinString {
    fn stdin_string(&mut self, input: &str) -> std::io::Result<std::process::Output>;
}

impl StdinString for std::process::Command {
    fn stdin_string(&mut self, input: &str) -> std::io::Result<std::process::Output> {
        use std::process::Stdio;
        let mut child =
            self.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        child.stdin.take().map(|mut i| i.write_all(input.as_bytes())).transpose()?;
        child.wait_with_output()
    }
}

#[test]
fn events_published_before_the_subscription_reaches_the_publisher_are_not_lost() {
    // A hop between kvdir and the publisher (a proxy, a NAT, a listen backlog) accepts the TCP
    // connection long before the publisher sees kvdir's subscription. A snapshot taken in
    // between would be followed by events the publisher drops for want of a subscriber.
    let eng = engine("late-subscriber", 1, 0);
    let upstream = eng.endpoints()[0].event.trim_start_matches("tcp://").to_string();
    let proxy = Blackhole::held(&upstream);
    let mut streams = streams_of(&eng);
    streams[0]["endpoint"] = json!(format!("tcp://{}", proxy.addr));
    let svc = service(streams, json!({}));
    eventually("kvdir's TCP connection to reach the proxy", || {
        match proxy.accepted.load(Ordering::SeqCst) {
            0 => Err("no connection yet".to_string()),
            _ => Ok(()),
        }
    });
    let a = prompt(1, 2);
    eng.process(0, &a).unwrap(); // no subscriber at the publisher yet: this event is dropped
    proxy.release();
    assert_eq!(agrees(&svc, &eng, 0, &a), (32, 0));
}

/// A TCP proxy to `upstream` that accepts connections but forwards nothing until
/// [`Blackhole::release`].
struct Blackhole {
    addr: String,
    accepted: Arc<AtomicUsize>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Blackhole {
    fn held(upstream: &str) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let flag = |v| Arc::new(AtomicBool::new(v));
        let (paused, stop) = (flag(true), flag(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (p, s, n) = (paused.clone(), stop.clone(), accepted.clone());
        let up = upstream.to_string();
        let accept = thread::spawn(move || {
            let mut pumps = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let server = TcpStream::connect(&up).unwrap();
                        pumps.push(pump(&client, &server, &p, &s));
                        pumps.push(pump(&server, &client, &p, &s));
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    // Non-blocking accept, so that `stop` is seen: an idle proxy's tick.
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Blackhole { addr, accepted, paused, stop, threads: vec![accept] }
    }

    fn release(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` until stopped; while paused it holds both sockets and copies nothing.
fn pump(
    from: &TcpStream,
    to: &TcpStream,
    paused: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) -> JoinHandle<()> {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    let (paused, stop) = (Arc::clone(paused), Arc::clone(stop));
    from.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while !stop.load(Ordering::Relaxed) {
            if paused.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(20)); // holding the sockets, copying nothing
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        }
    })
}
