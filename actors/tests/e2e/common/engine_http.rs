//! A vLLM server's HTTP side for tests on 127.0.0.1: `/health`, `/metrics` (vLLM's gauge names
//! and `process_start_time_seconds`, values set by the test) and `/v1/completions`. kvdir
//! polls the first two to learn a listed engine's state, load and process identity.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;

/// What the test engine's `/health` and `/metrics` answer.
#[derive(Clone)]
pub struct EngineState {
    pub healthy: bool,
    /// `process_start_time_seconds`; `None` leaves it out.
    pub start_time: Option<f64>,
    pub waiting: u64,
    pub running: u64,
    pub usage: f64,
    /// The `_sum`s of vLLM's prefill histograms: uncached tokens and seconds; `None` leaves
    /// them out.
    pub prefill: Option<(f64, f64)>,
    /// How long `/v1/completions` takes to answer.
    pub completion_time: std::time::Duration,
}

/// The test engine's HTTP side on 127.0.0.1 (one thread, one request per connection).
pub struct TestEngine {
    /// Its HTTP port.
    pub port: u16,
    state: Arc<Mutex<EngineState>>,
    /// `/v1/completions` requests received (counted before the answer's delay).
    pub completions: Arc<AtomicU64>,
}

impl TestEngine {
    /// Serves on a free port of 127.0.0.1 until the test ends.
    pub fn start() -> TestEngine {
        TestEngine::start_at("127.0.0.1:0")
    }

    /// Serves on `addr` (a loopback `ip:port`; port 0: a free one) until the test ends.
    pub fn start_at(addr: &str) -> TestEngine {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding {addr}: {e}"));
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(EngineState {
            healthy: true,
            start_time: Some(1_764_598_123.25),
            waiting: 3,
            running: 2,
            usage: 0.25,
            prefill: None,
            completion_time: std::time::Duration::ZERO,
        }));
        let (shared, completions) = (Arc::clone(&state), Arc::new(AtomicU64::new(0)));
        let received = Arc::clone(&completions);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let s = shared.lock().unwrap().clone();
                let _ = answer(conn, &s, &received);
            }
        });
        TestEngine { port, state, completions }
    }

    /// Changes what it answers.
    pub fn set(&self, f: impl FnOnce(&mut EngineState)) {
        f(&mut self.state.lock().unwrap());
    }
}

/// Reads one request and answers it as a vLLM server would (the parts kvdir reads).
fn answer(mut conn: TcpStream, s: &EngineState, completions: &AtomicU64) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let (mut line, mut length) = (String::new(), 0usize);
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    reader.read_exact(&mut vec![0; length])?;
    if path == "/v1/completions" {
        completions.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(s.completion_time); // the engine's own work, not a synchronisation
    }
    let (status, body) = match path.as_str() {
        "/health" if s.healthy => ("200 OK", String::new()),
        "/health" => ("503 Service Unavailable", String::new()),
        "/metrics" => ("200 OK", metrics(s)),
        "/v1/completions" => ("200 OK", json!({"served_by": "test-engine"}).to_string()),
        _ => ("404 Not Found", String::new()),
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
}

fn metrics(s: &EngineState) -> String {
    let l = "{engine=\"0\",model_name=\"kvdir-demo\"}";
    let start = s.start_time.map_or(String::new(), |t| {
        format!("# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {t}\n")
    });
    let prefill = s.prefill.map_or(String::new(), |(tokens, seconds)| {
        format!(
            "vllm:request_prefill_kv_computed_tokens_sum{l} {tokens:?}\n\
             vllm:request_prefill_time_seconds_bucket{{engine=\"0\",le=\"+Inf\"}} 1.0\n\
             vllm:request_prefill_time_seconds_sum{l} {seconds:?}\n"
        )
    });
    format!(
        "{start}# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{l} {}\n\
         vllm:num_requests_running{l} {}\nvllm:kv_cache_usage_perc{l} {}\n{prefill}",
        s.waiting, s.running, s.usage
    )
}
