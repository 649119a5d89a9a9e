//! The `kvdir` binary as an operator runs it: flags, config checking with every problem
//! reported, and a real run against a simulated engine, queried over HTTP.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{eventually, kvdir, post_to, request, spawn, spawn_command, Patience};
use kvdir_sim::{EngineConfig, SimEngine};

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

#[test]
fn version_and_help() {
    let out = kvdir().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("kvdir {}", env!("CARGO_PKG_VERSION"))
    );
    let out = kvdir().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--kv_events_config_file <PATH>"), "{help}");
    assert!(help.contains("[env: KVDIR_ETCD_ADDR]"), "{help}");
    assert!(help.contains("router for vLLM, SGLang and xLLM fleets"), "{help}");
}

#[test]
fn every_flag_can_come_from_the_environment_and_the_command_line_wins() {
    let config = repo_file("config/vllm-engines.json");
    let out = kvdir()
        .env("KVDIR_CHECK_CONFIG", "true")
        .env("KVDIR_KV_EVENTS_CONFIG_FILE", &config)
        .env("KVDIR_HTTP_SERVER_PORT", "99999")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "the environment alone is not the demo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--http_server_port=\"99999\" is not an integer in 0..=65535 (set by \
             KVDIR_HTTP_SERVER_PORT)"
        ),
        "{err}"
    );
    let out = kvdir()
        .env("KVDIR_CHECK_CONFIG", "true")
        .env("KVDIR_KV_EVENTS_CONFIG_FILE", &config)
        .env("KVDIR_HTTP_SERVER_PORT", "99999")
        .arg("--http_server_port=9000")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.trim(), "configuration is valid");
}

#[test]
fn the_example_configs_are_valid() {
    for file in [
        "config/static-streams.json",
        "config/kv_events_discovery_config.json",
        "config/vllm-engines.json",
        "config/sglang-engines.json",
    ] {
        let out = kvdir()
            .arg("--check_config")
            .arg(format!("--kv_events_config_file={}", repo_file(file).display()))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{file}: {text} {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text.trim(), "configuration is valid");
    }
}

#[test]
fn an_xllm_service_block_size_flag_is_accepted_with_a_warning() {
    let config = repo_file("config/kv_events_discovery_config.json");
    let out = kvdir()
        .args(["--check_config", "--block_size=128"])
        .arg(format!("--kv_events_config_file={}", config.display()))
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout} {stderr}");
    assert_eq!(stdout.trim(), "configuration is valid");
    assert!(stderr.contains("WARN"), "{stderr}");
    assert!(stderr.contains("--block_size=128 does not configure the directory"), "{stderr}");
}

#[test]
fn bad_flags_and_configs_exit_2_with_every_problem() {
    let out = kvdir().args(["--http_server_port=99999", "--nope=1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid configuration (2 problems)"), "{err}");
    assert!(err.contains("--http_server_port=\"99999\" is not an integer in 0..=65535"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"streams": [{"instance_name": "a", "endpoint": "tcp://*:1"}], "max_streams": 70000}"#,
    )
    .unwrap();
    let out = kvdir().arg(format!("--kv_events_config_file={}", path.display())).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for p in [
        "max_streams = 70000",
        "streams[0].replay_endpoint: missing",
        "host \"*\" is not connectable",
    ] {
        assert!(err.contains(p), "missing {p:?} in {err}");
    }
    let out = kvdir().arg("--kv_events_config_file=/nonexistent/kv.json").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot read --kv_events_config_file /nonexistent/kv.json"));
}

/// Starts the binary on a free port against one simulated engine and reads its answer.
#[test]
fn the_binary_serves_a_simulated_engines_cache() {
    let eng =
        SimEngine::start(EngineConfig { name: "bin".into(), block_size: 4, ..Default::default() })
            .unwrap();
    let ep = &eng.endpoints()[0];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.json");
    let config = serde_json::json!({"streams": [{"instance_name": "bin", "block_size": 4,
        "endpoint": ep.event, "replay_endpoint": ep.replay, "topic": "xllm-kv"}]});
    std::fs::write(&path, config.to_string()).unwrap();
    eng.process(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let config_flag = format!("--kv_events_config_file={}", path.display());
    let kv = spawn(&["--http_server_port=0", &config_flag], "kvdir listening on http://");
    eventually("the engine's two blocks synchronized and matched", || {
        let query = r#"{"token_ids":[1,2,3,4,5,6,7,8,9]}"#;
        let body = post_to(&kv.addr, "/v1/internal/kv-cache/query", query);
        let matched =
            body.contains("\"synchronized\":true") && body.contains("\"device_hit_tokens\":8");
        matched.then_some(()).ok_or(body)
    });
    drop(kv);
}

/// `kvdir --demo`: simulated engines in-process, all four streams synchronized (once each, with
/// no recovery: nothing failed), routes answered, and the front door's `curl` line it prints
/// answers a chat through one of its engines.
#[test]
fn the_demo_runs_without_any_setup() {
    let args = ["--demo", "--demo_seconds=60", "--http_server_port=0"];
    let kv = spawn(&args, "kvdir demo listening on http://");
    let addr = &kv.addr;
    let first_syncs = |streams: &serde_json::Value| {
        let all = streams["streams"].as_array().cloned().unwrap_or_default();
        all.iter().filter(|s| s["initial_syncs"] == 1).count()
    };
    let (query, route, streams) =
        Patience::new(Duration::from_secs(30)).eventually("the demo", || {
            let query = post_to(addr, "/v1/internal/kv-cache/query", r#"{"token_ids":[]}"#);
            let route = post_to(addr, "/v1/internal/route", r#"{"token_ids":[1,2,3,4]}"#);
            let body = request(addr, "GET", "/v1/internal/streams", None, None).body;
            let streams: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let synchronized = query.matches("\"synchronized\":true").count();
            let routed = route.contains("\"prefill\":\"127.0.0.1:");
            match synchronized == 4 && routed && first_syncs(&streams) == 4 {
                true => Ok((query, route, streams)),
                false => Err(format!("{query} {route} {streams}")),
            }
        });
    assert_eq!(query.matches("\"synchronized\":true").count(), 4, "{query}");
    assert_eq!(first_syncs(&streams), 4, "{streams:#}");
    for s in streams["streams"].as_array().unwrap() {
        assert_eq!(s["recoveries"], 0, "a healthy demo stream recovered from nothing: {s}");
    }
    assert!(
        route.contains("\"policy\":\"CAR\"") && route.contains("\"prefill\":\"127.0.0.1:"),
        "{route}"
    );
    let chat = r#"{"model":"kvdir-demo","messages":[{"role":"user","content":"Hello!"}]}"#;
    let reply = request(addr, "POST", "/v1/chat/completions", None, Some(chat));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.head.to_lowercase().contains("x-kvdir-instance: 127.0.0.1:"), "{}", reply.head);
    let answer: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert!(answer["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
    drop(kv);
}

/// The demo writes its model to a temporary directory and removes it once kvdir has loaded it,
/// so even a demo stopped with Ctrl-C leaves nothing behind; an unusable `TMPDIR` is named.
#[test]
fn the_demo_removes_its_model_files_once_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = kvdir();
    cmd.args(["--demo", "--demo_seconds=60", "--http_server_port=0"]).env("TMPDIR", tmp.path());
    let kv = spawn_command(cmd, "kvdir demo listening on http://");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    drop(kv);
    assert!(left.is_empty(), "the demo left {left:?} in TMPDIR");

    let missing = tmp.path().join("missing");
    let out = kvdir()
        .args(["--demo", "--demo_seconds=1", "--http_server_port=0"])
        .env("TMPDIR", &missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&missing.display().to_string()) && err.contains("TMPDIR"), "{err}");
}

/// Runs a one-second demo with `envs` and `args` and returns its stderr lines.
fn demo_logs(args: &[&str], envs: &[(&str, &str)]) -> Vec<String> {
    let out = kvdir()
        .args(["--demo", "--demo_seconds=1", "--http_server_port=0"])
        .args(args)
        .env_remove("RUST_LOG")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).lines().map(str::to_string).collect()
}

/// `--log_format=json` writes one JSON object per line; `RUST_LOG` filters by level.
#[test]
fn logs_are_text_or_json_and_filtered_by_rust_log() {
    let json = demo_logs(&["--log_format=json"], &[]);
    let connected = json
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|v| v["level"] == "INFO" && v["message"] == "connected to publisher")
        .count();
    assert_eq!(connected, 4, "one INFO line per demo stream: {json:#?}");

    let text = demo_logs(&[], &[]);
    assert!(text.iter().any(|l| l.contains(" INFO ") && l.contains("connected to publisher")));
    let quiet = demo_logs(&["--log_format=text"], &[("RUST_LOG", "warn")]);
    assert!(quiet.iter().all(|l| !l.contains(" INFO ")), "RUST_LOG=warn hides INFO: {quiet:#?}");
}

/// The demo's banner (the URLs to open) is the first thing it prints: its start-up logs (the
/// engines' and HTTP servers' INFO lines) come below it, on one terminal's stdout and stderr.
#[test]
fn the_demo_banner_comes_before_its_start_up_logs() {
    use std::io::{Read, Seek};
    let mut terminal = tempfile::tempfile().unwrap();
    let status = kvdir()
        .args(["--demo", "--demo_seconds=1", "--http_server_port=0"])
        .env_remove("RUST_LOG")
        .stdout(terminal.try_clone().unwrap())
        .stderr(terminal.try_clone().unwrap())
        .status()
        .unwrap();
    let mut shown = String::new();
    terminal.rewind().unwrap();
    terminal.read_to_string(&mut shown).unwrap();
    assert!(status.success(), "{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    let banner = lines.iter().position(|l| l.starts_with("  metrics:   curl"));
    assert!(lines[0].starts_with("kvdir demo listening on http://"), "{shown}");
    let banner_end = banner.unwrap_or_else(|| panic!("no banner: {shown}"));
    let first_log = lines.iter().position(|l| l.contains(" INFO "));
    assert!(first_log.is_some_and(|i| i > banner_end), "INFO lines below the banner: {shown}");
}
