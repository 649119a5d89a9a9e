//! Helpers for the etcd tests: engines on free HTTP ports (with the derived ZeroMQ ports), a
//! synchronous etcd reader, a heartbeat sink (a tiny std HTTP server that records what it is
//! sent), and the test kit's [`eventually`] and [`Patience`], the polling with a deadline every
//! test uses instead of sleeping.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use kvdir_etcd::Client;
use kvdir_sim::{EngineConfig, SimEngine, SimError};
use kvdir_testkit::etcd::EtcdServer;
use serde_json::Value;

/// Upper bound for anything that should happen promptly.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Polls until a check holds, with a deadline (the workspace test kit's).
pub use kvdir_testkit::{eventually, Patience};

/// An engine with an HTTP port in 20000..25000 whose derived ports (+10000, +30000) are free.
pub fn engine_with_http(dp_size: u32) -> SimEngine {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2654435761) % 4000;
    for _attempt in 0..50 {
        let slot = (seed + NEXT.fetch_add(1, Ordering::Relaxed) * 8) % 4900;
        let http_port = 20000 + u16::try_from(slot).expect("below 4900");
        let config = EngineConfig {
            name: format!("etcd-{http_port}"),
            http_port,
            dp_size,
            ..EngineConfig::default()
        };
        match SimEngine::start(config) {
            Ok(engine) => return engine,
            Err(SimError::Bind { .. } | SimError::Http { .. }) => continue,
            Err(e) => panic!("the engine does not start: {e}"),
        }
    }
    panic!("no free HTTP port with free derived ports in 50 attempts");
}

/// A stored key: value and lease (0 = none).
pub struct Kv {
    pub value: Vec<u8>,
    pub lease: i64,
}

/// A synchronous etcd client for assertions.
pub struct EtcdReader {
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl EtcdReader {
    pub fn new(etcd: &EtcdServer) -> EtcdReader {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = Client::new(&etcd.endpoint, Duration::from_secs(2)).expect("an etcd endpoint");
        EtcdReader { runtime, client }
    }

    /// The key's value, or `None` when absent. Retries transient errors until [`DEADLINE`].
    pub fn get(&self, key: &str) -> Option<Kv> {
        let get =
            || self.runtime.block_on(self.client.get(key.as_bytes())).map_err(|e| e.to_string());
        let found = Patience::new(DEADLINE).eventually(&format!("etcd get {key}"), get);
        found.map(|kv| Kv { value: kv.value, lease: kv.lease })
    }

    pub fn delete(&self, key: &str) {
        self.runtime.block_on(self.client.delete(key.as_bytes())).expect("etcd delete");
    }
}

/// One heartbeat as received.
#[derive(Debug, Clone)]
pub struct Beat {
    pub path: String,
    pub token: Option<String>,
    pub body: Value,
}

/// A tiny HTTP server recording every request and answering with a settable status.
pub struct HeartbeatSink {
    addr: String,
    beats: Arc<Mutex<Vec<Beat>>>,
    status: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HeartbeatSink {
    pub fn start(status: u16) -> HeartbeatSink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the sink");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let beats = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(status));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s, st) = (Arc::clone(&beats), Arc::clone(&status), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => serve(stream, &b, &s),
                    // Non-blocking accept, so that `stop` is seen: an idle server's tick.
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        HeartbeatSink { addr, beats, status, stop, thread: Some(thread) }
    }

    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub fn count(&self) -> usize {
        self.beats.lock().unwrap().len()
    }

    /// The first recorded heartbeat matching `pred`, waiting up to [`DEADLINE`].
    pub fn wait_for(&self, pred: impl Fn(&Beat) -> bool) -> Beat {
        let mut found = None;
        Patience::new(DEADLINE).eventually("a matching heartbeat arrives", || {
            found = self.beats.lock().unwrap().iter().find(|b| pred(b)).cloned();
            found.is_some()
        });
        found.expect("found")
    }
}

impl Drop for HeartbeatSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request (head and `Content-Length` body), records it, answers `status`.
fn serve(mut stream: TcpStream, beats: &Mutex<Vec<Beat>>, status: &AtomicU16) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let mut total = None;
    while total.is_none_or(|t| raw.len() < t) && raw.len() < 1 << 20 {
        let Ok(n) = stream.read(&mut buf) else { return };
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
            let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok());
            total = Some(end + 4 + length.unwrap_or(0));
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let path = head.split_whitespace().nth(1).unwrap_or_default().to_string();
    let token = head.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-internal-token"))
            .map(|(_, v)| v.trim().to_string())
    });
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    beats.lock().unwrap().push(Beat { path, token, body });
    let code = status.load(Ordering::SeqCst);
    let reply = format!("HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}");
    let _ = stream.write_all(reply.as_bytes());
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.trim() == name).map(|(_, v)| v.trim()))
}
