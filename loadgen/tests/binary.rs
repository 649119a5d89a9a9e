//! The `kvdir-bench` binary's command line: help and flag errors (also of `replay`), a missing
//! trace, and `--write_config` against a kvdir that never comes (the runs against a real kvdir
//! are in `actors/tests/e2e/bench.rs` and `actors/tests/e2e/replay.rs`, where the `kvdir` binary is
//! built).

use std::net::TcpListener;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kvdir-bench");

#[test]
fn help_lists_the_modes_and_the_load_flags() {
    let out = Command::new(BIN).arg("--help").output().expect("the binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--etcd_addr", "--write_config", "--spawn_kvdir", "--query_clients", "--json"] {
        assert!(help.contains(flag), "{flag} missing from {help}");
    }
}

#[test]
fn bad_flags_exit_with_status_2_and_name_every_problem() {
    let out = Command::new(BIN).args(["--engines=0", "--rate", "fast"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in ["--engines = 0 is below the minimum 1", "--rate=\"fast\"", "nothing tells"] {
        assert!(stderr.contains(needle), "{needle} missing from {stderr}");
    }
}

#[test]
fn write_config_writes_the_static_streams_then_fails_naming_the_missing_kvdir() {
    let dir = std::env::temp_dir().join(format!("kvdir-bench-bin-{}", std::process::id()));
    let path = dir.join("kv.json");
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["--engines=1", "--dp_size=2", "--block_size=16", "--sync_timeout_seconds=1"])
        .arg(format!("--write_config={}", path.display()))
        .arg(format!("--kvdir_addr={closed}"))
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("wrote {}", path.display())), "{stderr}");
    assert!(stderr.contains("kvdir did not get synchronized within 1 s"), "{stderr}");
    assert!(stderr.contains("connection refused") || stderr.contains("Connection refused"));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config written")).unwrap();
    let streams = config["streams"].as_array().expect("a streams list");
    assert_eq!(streams.len(), 2);
    assert_eq!(
        (&streams[1]["instance_name"], &streams[1]["block_size"]),
        (&"bench-0".into(), &16.into())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn replay_help_lists_its_flags() {
    let out = Command::new(BIN).args(["replay", "--help"]).output().expect("the binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--trace", "--engines", "--cache_blocks", "--speed", "--policy", "--json"] {
        assert!(help.contains(flag), "{flag} missing from {help}");
    }
}

#[test]
fn replay_with_bad_flags_exits_with_status_2_and_names_every_problem() {
    let out = Command::new(BIN)
        .args(["replay", "--engines=0", "--speed=fast", "--etcd_addr=127.0.0.1:1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in ["--trace FILE is required", "--spawn_kvdir PATH", "--engines = 0", "--speed"] {
        assert!(stderr.contains(needle), "{needle} missing from {stderr}");
    }
}

#[test]
fn replay_of_a_missing_trace_fails_naming_the_file() {
    let out = Command::new(BIN)
        .args(["replay", "--trace=/nonexistent/t.jsonl", "--etcd_addr=127.0.0.1:1"])
        .args(["--spawn_kvdir=/nonexistent/kvdir"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot read /nonexistent/t.jsonl"), "{stderr}");
}
