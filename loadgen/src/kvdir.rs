//! The kvdir under test ([`Kvdir`]): a running one named by `--kvdir_addr`, or a child started
//! from `--spawn_kvdir` with the generated config on 127.0.0.1 port 0. The child's address is
//! read from its first stdout line (`kvdir listening on http://ADDR`) within the sync
//! deadline; its stdout is drained afterwards and its stderr goes to `kvdir.log` beside the
//! config. The child is killed when the [`Kvdir`] is dropped.
//!
//! Also reads kvdir's resident memory ([`Rss`]): `/proc/<pid>/status` when the pid is known,
//! else the `process_resident_memory_bytes` gauge of `GET /metrics`; and, with the pid, its CPU
//! time ([`cpu_seconds`]).

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;

use serde_json::Value;

use super::flags::{BenchOptions, Mode};
use super::http::Conn;
use super::BenchError;

/// What the spawned kvdir prints first.
const LISTENING: &str = "kvdir listening on http://";

/// The kvdir under test.
pub struct Kvdir {
    /// HTTP address, `host:port`.
    pub addr: String,
    /// Process id, when known.
    pub pid: Option<u32>,
    child: Option<Child>,
    /// The spawned kvdir's stderr.
    log: Option<PathBuf>,
    /// A temporary directory to remove at the end.
    temp: Option<PathBuf>,
}

impl Kvdir {
    /// Writes `config` where `--write_config` says (or, when spawning, to a temporary
    /// directory), then starts `--spawn_kvdir` with it or names the running kvdir.
    pub fn start(o: &BenchOptions, config: &Value) -> Result<Kvdir, BenchError> {
        let temp = (o.write_config.is_none() && o.spawn_kvdir.is_some()).then(temp_dir);
        let path = match (&o.write_config, &temp) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(dir)) => Some(dir.join("kvdir.json")),
            (None, None) => None,
        };
        if let Some(path) = &path {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                fs::create_dir_all(dir).map_err(|e| BenchError::io("create", dir, e))?;
            }
            let text = serde_json::to_string_pretty(config).unwrap_or_default();
            fs::write(path, text).map_err(|e| BenchError::io("write", path, e))?;
        }
        let (Some(bin), Some(path)) = (&o.spawn_kvdir, &path) else {
            let addr = o.kvdir_addr.clone();
            return Ok(Kvdir { addr, pid: o.kvdir_pid, child: None, log: None, temp });
        };
        let log = path.with_file_name("kvdir.log");
        let mut kvdir =
            Kvdir { addr: String::new(), pid: None, child: None, log: Some(log.clone()), temp };
        let mut child = spawn(bin, &args(o, path), &log)?;
        kvdir.pid = Some(child.id());
        let stdout = child.stdout.take();
        kvdir.child = Some(child);
        kvdir.addr = read_address(stdout, o, &log)?;
        Ok(kvdir)
    }

    /// Adds to `e` what the spawned kvdir says: whether it exited, and the end of its log
    /// (which is then kept).
    pub fn explain(&mut self, e: BenchError) -> BenchError {
        let (Some(child), Some(log)) = (self.child.as_mut(), &self.log) else { return e };
        let state = match child.try_wait() {
            Ok(Some(status)) => format!("kvdir exited ({status})"),
            _ => "kvdir is running".to_string(),
        };
        // Keep the log for the user.
        self.temp = None;
        BenchError::Kvdir(format!("{e}; {state}; its log {}: {}", log.display(), tail(log)))
    }
}

impl Drop for Kvdir {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A child that already exited cannot be killed; either way it is reaped.
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.temp.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// A fresh path under the system temp directory, named after this process.
pub(crate) fn temp_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("kvdir-bench-{}-{nanos}", std::process::id()))
}

fn args(o: &BenchOptions, config: &Path) -> Vec<String> {
    let mut args = vec![
        format!("--kv_events_config_file={}", config.display()),
        "--http_server_port=0".to_string(),
        "--server_host=127.0.0.1".to_string(),
    ];
    if let Mode::Etcd { addr, namespace } = &o.mode {
        args.push(format!("--etcd_addr={addr}"));
        args.push(format!("--etcd_namespace={namespace}"));
    }
    if let Some(token) = &o.internal_api_token {
        args.push(format!("--internal_api_token={token}"));
    }
    args.extend(o.kvdir_args.iter().cloned());
    args
}

fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Child, BenchError> {
    let stderr = File::create(log).map_err(|e| BenchError::io("create", log, e))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| BenchError::io("start --spawn_kvdir", bin, e))
}

/// Reads the address line within the sync deadline, then drains stdout on a thread.
fn read_address(
    stdout: Option<std::process::ChildStdout>,
    o: &BenchOptions,
    log: &Path,
) -> Result<String, BenchError> {
    let stdout = stdout.ok_or_else(|| BenchError::Kvdir("no stdout pipe".to_string()))?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut out = BufReader::new(stdout);
        let mut line = String::new();
        let _ = tx.send(out.read_line(&mut line).map(|_| line));
        // Keep draining so kvdir never writes into a closed pipe.
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    let line = match rx.recv_timeout(o.sync_timeout) {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => return Err(BenchError::Kvdir(format!("reading its output: {e}"))),
        Err(_) => String::new(),
    };
    match line.trim().strip_prefix(LISTENING) {
        Some(addr) => Ok(addr.to_string()),
        None => Err(BenchError::Kvdir(format!(
            "it did not print {LISTENING:?} within {:.0} s (first line {:?}); its log {}: {}",
            o.sync_timeout.as_secs_f64(),
            line.trim(),
            log.display(),
            tail(log)
        ))),
    }
}

/// The last lines of a log file, for error messages.
pub fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// kvdir's resident memory and where the figure comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Rss {
    /// Resident bytes now; `None` when unknown.
    pub bytes: Option<u64>,
    /// Peak resident bytes (`VmHWM`), only from `/proc`.
    pub peak: Option<u64>,
    /// `/proc/<pid>/status`, `GET /metrics` or why it is unknown.
    pub source: String,
}

impl Rss {
    /// Reads `/proc/<pid>/status` when `pid` is known, else `GET /metrics`.
    pub fn read(pid: Option<u32>, conn: &mut Conn) -> Rss {
        if let Some(pid) = pid {
            let path = format!("/proc/{pid}/status");
            let status = fs::read_to_string(&path).unwrap_or_default();
            let kib = |key| kvdir::metrics::proc_status_bytes(&status, key);
            return Rss { bytes: kib("VmRSS:"), peak: kib("VmHWM:"), source: path };
        }
        match conn.get("/metrics") {
            Ok(reply) if reply.status == 200 => {
                let text = String::from_utf8_lossy(&reply.body);
                let bytes = metric(&text, "process_resident_memory_bytes").map(|b| b as u64);
                let source = match bytes {
                    Some(_) => "GET /metrics".to_string(),
                    None => "unknown (pass --kvdir_pid)".to_string(),
                };
                Rss { bytes, peak: None, source }
            }
            _ => Rss { bytes: None, peak: None, source: "unknown (pass --kvdir_pid)".to_string() },
        }
    }
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/<pid>/stat` (in ticks of
/// 1/100 s, Linux's USER_HZ); `None` when unreadable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// The value of an unlabelled Prometheus sample `name value`.
pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rss_gauge_is_read_from_prometheus_text() {
        let text = "# HELP process_resident_memory_bytes x\n# TYPE process_resident_memory_bytes \
                    gauge\nprocess_resident_memory_bytes_total 1\nprocess_resident_memory_bytes \
                    1.2345e7\n";
        assert_eq!(metric(text, "process_resident_memory_bytes"), Some(12_345_000.0));
        assert_eq!(metric("other 1\n", "process_resident_memory_bytes"), None);
    }

    #[test]
    fn own_rss_is_read_from_proc() {
        let mut conn = Conn::new("127.0.0.1:1", None, std::time::Duration::from_millis(100));
        let rss = Rss::read(Some(std::process::id()), &mut conn);
        assert!(rss.bytes.is_some_and(|b| b > 0) && rss.peak >= rss.bytes, "{rss:?}");
        assert!(cpu_seconds(std::process::id()).is_some_and(|s| s >= 0.0));
        assert_eq!(cpu_seconds(u32::MAX), None);
    }
}
