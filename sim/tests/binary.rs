//! The `kvdir-sim` binary: flags in, endpoints and a static-stream config out.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kvdir-sim");

#[test]
fn prints_endpoints_and_a_static_stream_config_then_stops_after_the_duration() {
    let out = Command::new(BIN)
        .args(["--event_port=0", "--replay_port", "0", "--dp_size=2", "--engines=2"])
        .args(["--block_size=16", "--rate=100", "--duration_s=1", "--name=demo"])
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let (_, json) = stdout.split_once("kvdir config (static streams):\n").expect("config header");
    let config: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    let streams = config["streams"].as_array().expect("a streams list");
    assert_eq!(streams.len(), 4);
    assert_eq!(streams[3]["instance_name"], "demo-1");
    assert_eq!(streams[3]["dp_rank"], 1);
    assert_eq!(streams[3]["block_size"], 16);
    assert_eq!(streams[3]["topic"], "xllm-kv");
    let endpoint = streams[3]["endpoint"].as_str().expect("endpoint");
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    assert!(stdout.contains(&format!("events {endpoint}")));
}

#[test]
fn bad_flags_exit_with_status_2_and_name_every_problem() {
    let out = Command::new(BIN).args(["--dp_size=0", "--hash_mode=md5"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hash_mode = \"md5\" is not one of u64, bin32"), "{stderr}");
}
