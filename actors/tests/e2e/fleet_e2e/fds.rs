//! Descriptors are a budget: the `kvdir` binary under a low open-file limit, a few hundred
//! streams driven into recovery at once. kvdir plans its descriptors at start and lowers the
//! replays that may run at once to fit, so every stream ends live with no stream thread
//! restarted and none left waiting for a descriptor.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use super::publishers::Fleet;
use super::{enough_fds, PUBLISHER_FDS_PER_STREAM};
use crate::common::*;

/// Streams of the test.
const STREAMS: usize = 300;
/// kvdir's open-file limit: its 256 reserved, 16 HTTP connections and 300 streams of 4 fit
/// with 14 replays at once, not with the 300 the config asks for (2 more each).
const LIMIT: u64 = 1500;

/// The sum of a family's samples in a `/metrics` text.
fn sum(metrics: &str, family: &str) -> f64 {
    let samples = metrics
        .lines()
        .filter(|l| l.strip_prefix(family).is_some_and(|rest| rest.starts_with([' ', '{'])));
    samples.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[test]
fn hundreds_of_streams_recover_at_once_under_a_low_open_file_limit_without_restarts() {
    enough_fds(STREAMS, PUBLISHER_FDS_PER_STREAM);
    let fleet = Fleet::start(STREAMS, 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.json");
    let config = json!({"streams": fleet.streams(), "max_streams": STREAMS,
        "max_concurrent_replays": 1000});
    std::fs::write(&path, config.to_string()).unwrap();
    // `ulimit -n` sets the soft and the hard limit of the shell, which kvdir inherits.
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("ulimit -n {LIMIT} && exec \"$0\" \"$@\""));
    cmd.arg(env!("CARGO_BIN_EXE_kvdir")).args([
        "--http_server_port=0",
        "--etcd_addr=",
        "--http_max_connections=16",
        &format!("--kv_events_config_file={}", path.display()),
    ]);
    let kv = spawn_command(cmd, "kvdir listening on http://");
    let get = |path: &str| request(&kv.addr, "GET", path, None, None).body;
    let live = |recoveries: u64| {
        let r: Value = serde_json::from_str(&get("/v1/internal/streams")).unwrap();
        let all = r["streams"].as_array().cloned().unwrap_or_default();
        let done = all
            .iter()
            .filter(|s| s["phase"] == "live" && s["recoveries"].as_u64() == Some(recoveries));
        match done.count() {
            n if n == STREAMS => Ok(()),
            n => Err(format!("{n} of {} live after {recoveries} recoveries", all.len())),
        }
    };
    let patience = Patience::new(Duration::from_secs(120));
    patience.eventually("every stream to synchronize", || live(0));
    fleet.lose_one();
    fleet.publish(1);
    patience.eventually("every stream to recover from its gap", || live(1));
    let metrics = get("/metrics");
    assert_eq!(sum(&metrics, "process_max_fds"), LIMIT as f64, "the limit kvdir runs under");
    assert!(sum(&metrics, "process_open_fds") < LIMIT as f64, "{metrics}");
    assert_eq!(sum(&metrics, "kvdir_stream_restarts_total"), 0.0, "no restart loop");
    assert_eq!(sum(&metrics, "kvdir_fd_waits_total"), 0.0, "no stream short of a descriptor");
    assert_eq!(sum(&metrics, "kvdir_sequence_gaps_total"), STREAMS as f64, "one gap each");
}
