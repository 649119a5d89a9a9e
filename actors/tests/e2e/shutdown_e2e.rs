//! The `kvdir` binary stopped as a container runtime stops it: SIGTERM (and SIGINT, Ctrl-C)
//! stops new connections, lets a request in flight finish, and exits 0.

use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvdir_testkit::eventually;
use serde_json::json;

use crate::common::*;

fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status();
    assert!(ok.is_ok_and(|s| s.success()), "kill -{name} {pid}");
}

/// kvdir with one listed engine (no KV events) whose completions take `slow`.
fn kvdir_before_a_slow_engine(slow: Duration) -> (TestEngine, Running, tempfile::TempDir) {
    let http = TestEngine::start();
    http.set(|s| s.completion_time = slow);
    let tmp = tempfile::tempdir().unwrap();
    let config = json!({"engines": [{"name": "slow", "dialect": "vllm", "block_size": 16,
        "url": format!("http://127.0.0.1:{}", http.port), "model": "kvdir-demo"}],
        "engine_poll_interval_ms": 100});
    let path = tmp.path().join("engines.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let model = tmp.path().join("kvdir-demo");
    kvdir_text::demo::write_model(&model).unwrap();
    let kv = spawn(
        &[
            "--http_server_port=0",
            "--etcd_addr=",
            &format!("--kv_events_config_file={}", path.display()),
            &format!("--tokenizer_path={}", model.display()),
        ],
        "kvdir listening on http://",
    );
    eventually("the engine is routable", || {
        let r = request(&kv.addr, "GET", "/v1/internal/instances", None, None);
        match r.body.contains("\"ACTIVE\"") {
            true => Ok(()),
            false => Err(r.body),
        }
    });
    (http, kv, tmp)
}

fn sigterm_finishes_the_request_in_flight_then_exits_0(name: &str) {
    let (http, mut kv, _tmp) = kvdir_before_a_slow_engine(Duration::from_millis(1500));
    let addr = kv.addr.clone();
    let in_flight = std::thread::spawn(move || {
        let body = json!({"model": "kvdir-demo", "prompt": "hello there"}).to_string();
        request(&addr, "POST", "/v1/completions", None, Some(&body))
    });
    eventually("the request reaches the engine", || {
        match http.completions.load(Ordering::SeqCst) {
            1 => Ok(()),
            n => Err(format!("{n} requests")),
        }
    });
    signal(kv.child.id(), name);
    eventually("no new connections", || match TcpStream::connect(&kv.addr) {
        Err(_) => Ok(()),
        Ok(_) => Err("still accepting".to_string()),
    });
    let r = in_flight.join().unwrap();
    assert_eq!((r.status, r.json()["served_by"].as_str()), (200, Some("test-engine")), "{r:?}");
    let status =
        eventually("kvdir exits", || kv.child.try_wait().unwrap().ok_or("running".to_string()));
    assert_eq!(status.code(), Some(0), "{name}: {status:?}");
}

#[test]
fn sigterm_finishes_requests_in_flight_and_exits_0() {
    sigterm_finishes_the_request_in_flight_then_exits_0("TERM");
}

#[test]
fn sigint_stops_kvdir_the_same_way() {
    sigterm_finishes_the_request_in_flight_then_exits_0("INT");
}
