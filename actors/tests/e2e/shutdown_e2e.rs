//! The `kvdir` binary stopped as a container runtime stops it: SIGTERM (and SIGINT, Ctrl-C)
//! stops new connections, lets a request in flight finish, and exits 0. So does every mode: the
//! demo (which then leaves no files), kvdir bound for engines that connect to it and announce
//! themselves (the bound socket with a publisher on it, the registry following etcd), and kvdir
//! watching engine pods on a real Kubernetes API server (its watch request open).

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

/// Sends SIGTERM and waits for the exit: 0, and the HTTP port closed.
fn sigterm_exits_0(kv: &mut Running) {
    signal(kv.child.id(), "TERM");
    let status =
        eventually("kvdir exits", || kv.child.try_wait().unwrap().ok_or("running".to_string()));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(TcpStream::connect(&kv.addr).is_err(), "{} still accepts", kv.addr);
}

#[test]
fn the_demo_stops_on_sigterm_and_exits_0_leaving_no_files() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = kvdir();
    cmd.args(["--demo", "--http_server_port=0"]).env("TMPDIR", tmp.path());
    let mut kv = spawn_command(cmd, "kvdir demo listening on http://");
    eventually("the demo routes", || {
        let r = request(&kv.addr, "GET", "/v1/internal/route/recent", None, None);
        match r.json()["total"].as_u64().is_some_and(|n| n > 0) {
            true => Ok(()),
            false => Err(r.body),
        }
    });
    sigterm_exits_0(&mut kv);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} in TMPDIR");
}

#[test]
fn kvdir_bound_for_announcing_engines_stops_on_sigterm_and_exits_0() {
    let etcd = kvdir_testkit::etcd::etcd_endpoint();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tmp = tempfile::tempdir().unwrap();
    let config = json!({"kv_events_bind": {"endpoint": format!("tcp://127.0.0.1:{port}"),
        "announce": {"allow": ["127.0.0.0/8"], "replay_port": 5558, "block_size": 16}}});
    let path = tmp.path().join("central.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let mut kv = spawn(
        &[
            "--http_server_port=0",
            &format!("--etcd_addr={}", etcd.endpoint),
            &format!("--kv_events_config_file={}", path.display()),
        ],
        "kvdir listening on http://",
    );
    // An engine's publisher on the bound socket: kvdir's subscription reaches it.
    let ctx = zmq::Context::new();
    let publisher = ctx.socket(zmq::XPUB).unwrap();
    publisher.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    eventually("kvdir's subscription", || match publisher.recv_bytes(zmq::DONTWAIT) {
        Ok(m) if m.first() == Some(&1) => Ok(()),
        _ => Err("not yet".to_string()),
    });
    let frames = [b"kv@127.0.0.1:1@m".to_vec(), 0u64.to_be_bytes().to_vec(), vec![0x90]];
    publisher.send_multipart(frames, 0).unwrap();
    sigterm_exits_0(&mut kv);
}

#[test]
fn kvdir_watching_engine_pods_stops_on_sigterm_and_exits_0() {
    use kvdir_testkit::kube::{KubeApiServer, User, NAMESPACE};
    let server = KubeApiServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig(User::Kvdir);
    let config = json!({"kubernetes": {"namespace": NAMESPACE,
        "kubeconfig": kubeconfig.display().to_string()}});
    let path = tmp.path().join("pods.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let config = format!("--kv_events_config_file={}", path.display());
    let mut kv =
        spawn(&["--http_server_port=0", "--etcd_addr=", &config], "kvdir listening on http://");
    eventually("the pods listed and watched", || {
        let r = request(&kv.addr, "GET", "/v1/internal/instances", None, None);
        match r.json()["kubernetes"]["connected"] == true {
            true => Ok(()),
            false => Err(r.body),
        }
    });
    sigterm_exits_0(&mut kv);
}
