//! The `kvdir-sim` binary: flags in, endpoints and a static-stream config out, and the OpenAI
//! endpoints served with `--tokenizer_path`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kvdir-sim");

/// Runs the binary for one second with `args` after ephemeral ports, block size 16 and 100
/// requests per second; returns its stdout and the static-stream config it printed.
fn run_briefly(args: &[&str]) -> (String, serde_json::Value) {
    let out = Command::new(BIN)
        .args(["--event_port=0", "--replay_port", "0", "--block_size=16", "--rate=100"])
        .arg("--duration_s=1")
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let (_, json) = stdout.split_once("kvdir config (static streams):\n").expect("config header");
    let config = serde_json::from_str(json).expect("valid JSON");
    (stdout, config)
}

#[test]
fn prints_endpoints_and_a_static_stream_config_then_stops_after_the_duration() {
    let (stdout, config) = run_briefly(&["--dp_size=2", "--engines=2", "--name=demo"]);
    let streams = config["streams"].as_array().expect("a streams list");
    assert_eq!(streams.len(), 4);
    assert_eq!(streams[3]["instance_name"], "demo-1");
    assert_eq!(streams[3]["dp_rank"], 1);
    assert_eq!(streams[3]["block_size"], 16);
    assert_eq!(streams[3]["topic"], "xllm-kv");
    let endpoint = streams[3]["endpoint"].as_str().expect("endpoint");
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    assert!(stdout.contains(&format!("events {endpoint}")));
    assert!(streams[3].get("replay").is_none(), "xLLM streams are unchanged: {}", streams[3]);
}

#[test]
fn the_vllm_dialect_prints_history_replay_streams_and_registers_nowhere() {
    let (stdout, config) = run_briefly(&["--dialect=vllm", "--buffer_steps=5", "--name=v"]);
    assert_eq!(config["streams"][0]["replay"], "history");
    let replay = config["streams"][0]["replay_endpoint"].as_str().expect("replay endpoint");
    assert!(stdout.contains(&format!("history replay {replay}")), "{stdout}");
    assert!(!stdout.contains("registered"), "{stdout}");
}

#[test]
fn bad_flags_exit_with_status_2_and_name_every_problem() {
    let out = Command::new(BIN).args(["--dp_size=0", "--hash_mode=md5"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hash_mode = \"md5\" is not one of u64, bin32"), "{stderr}");
}

#[test]
fn with_a_tokenizer_the_binary_serves_chat_completions_on_its_http_port() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join("model");
    let out = Command::new(BIN).arg(format!("--write_demo_model={}", dir.display())).output();
    assert!(out.expect("the binary runs").status.success());
    assert!(dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file());
    let seed = std::process::id() % 400;
    for attempt in 0..10 {
        let port = 25000 + (seed + attempt * 37) % 400 * 10;
        let mut child = Command::new(BIN)
            .args([format!("--http_port={port}"), "--dp_size=2".into(), "--rate=0".into()])
            .args(["--block_size=4".to_string(), "--duration_s=60".into()])
            .arg(format!("--tokenizer_path={}", dir.display()))
            .args(["--served_model_name=demo", "--prefill_us_per_token=0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary runs");
        // Drain stdout on a thread for as long as the child lives, so it never hits a full or
        // closed pipe; the lines come through a channel.
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (lines, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let line = received.iter().find(|l| l.contains("openai: "));
        let Some(line) = line else {
            let _ = child.wait();
            continue; // The port was taken; try another.
        };
        assert!(line.contains(&format!("127.0.0.1:{port}/v1/chat/completions")), "{line}");
        let body = r#"{"model": "demo", "messages": [{"role": "user", "content": "Hello there"}]}"#;
        let answer = kvdir_sim::http::request(
            &format!("127.0.0.1:{port}"),
            "POST",
            "/v1/chat/completions",
            &[],
            Some(body),
            Duration::from_secs(20),
        );
        let _ = child.kill();
        let _ = child.wait();
        let answer = answer.expect("the engine answers");
        assert_eq!(answer.status, 200, "{}", answer.body);
        let json: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
        assert_eq!(json["usage"]["completion_tokens"], 16, "the default max_tokens");
        assert!(answer.head.contains("x-sim-dp-rank: 0"), "{}", answer.head);
        return;
    }
    panic!("no free HTTP port in 10 attempts");
}
