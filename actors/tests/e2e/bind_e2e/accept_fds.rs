//! The `kvdir` binary under a low open-file limit, its bind port flooded with connections:
//! an accept that finds no descriptor backs off (counted in `kvdir_fd_waits_total`) instead of
//! spinning, and once descriptors are free again the port accepts engines again. `/metrics` is
//! read on an HTTP connection opened before the flood (a new one would find no descriptor
//! either).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use super::free_ports;
use crate::common::*;

/// kvdir's open-file limit, and the connections the test opens to its bind port (more).
const LIMIT: u64 = 400;
const FLOOD: usize = 600;

/// One keep-alive HTTP connection to kvdir.
struct KeepAlive(TcpStream);

impl KeepAlive {
    /// `/metrics` on the connection, as text.
    fn metrics(&mut self) -> String {
        self.0.write_all(b"GET /metrics HTTP/1.1\r\nHost: kvdir\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = self.0.read(&mut buf).unwrap();
            assert!(n > 0, "kvdir closed the HTTP connection");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let head = text[..end].to_ascii_lowercase();
            let len = head.lines().find_map(|l| l.strip_prefix("content-length:"));
            let len: usize = len.expect("a content length").trim().parse().unwrap();
            if got.len() >= end + 4 + len {
                return text[end + 4..end + 4 + len].to_string();
            }
        }
    }

    /// The value of the metric `name` (no labels).
    fn metric(&mut self, name: &str) -> f64 {
        let text = self.metrics();
        let v = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok());
        v.unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

/// Whether a fresh connection to `port` gets kvdir's ZMTP greeting (it was accepted).
fn greeted(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut first = [0u8; 1];
    match s.read(&mut first) {
        Ok(1) if first[0] == 0xFF => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

#[test]
fn a_bind_port_out_of_descriptors_backs_off_and_accepts_again() {
    // The flood's descriptors in this process, beside the other tests' (they run at once).
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    setrlimit(Resource::Nofile, Rlimit { current: lim.maximum, maximum: lim.maximum }).unwrap();
    let port = free_ports(1);
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("ulimit -n {LIMIT} && exec \"$0\" \"$@\""));
    cmd.arg(env!("CARGO_BIN_EXE_kvdir")).args([
        "--http_server_port=0",
        "--etcd_addr=",
        "--http_keep_alive_ms=600000",
        "--http_max_connections=16",
        &format!("--kv_events_bind=tcp://127.0.0.1:{port}"),
    ]);
    let kv = spawn_command(cmd, "kvdir listening on http://");
    let mut http = KeepAlive(TcpStream::connect(&kv.addr).unwrap());
    assert_eq!(http.metric("kvdir_fd_waits_total"), 0.0);
    eventually("the bind port to accept", || greeted(port));

    let flood: Vec<TcpStream> =
        (0..FLOOD).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    // A listener that retried at once would count an accept per turn of its thread.
    let waits = eventually("an accept to wait for a descriptor twice", || {
        let waits = http.metric("kvdir_fd_waits_total");
        (waits >= 2.0).then_some(waits).ok_or(format!("{waits} waits"))
    });
    assert!(waits < 50.0, "accepts back off (200 ms doubling): {waits} waits");
    assert_eq!(http.metric("process_max_fds"), LIMIT as f64, "the limit kvdir runs under");

    drop(flood);
    // The connections close, their descriptors are free, and the next retry accepts.
    eventually("the bind port to accept again", || greeted(port));
}
