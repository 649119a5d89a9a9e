//! The etcd server of a test.
//!
//! - [`etcd_endpoint`] uses the server named by the environment variable `KVDIR_TEST_ETCD`
//!   (`host:port`; CI starts one etcd and sets it), else spawns a private one.
//! - [`EtcdServer::private`] always spawns a private `etcd` (Debian package `etcd-server`,
//!   binary `etcd` on `PATH`) on free 127.0.0.1 client and peer ports with a fresh data
//!   directory under the system temp dir, waits until its `GET /health` answers (deadline
//!   [`START_DEADLINE`]), and kills it and removes the directory on drop. Tests that stop or
//!   restart etcd need a private server: [`EtcdServer::restart`] and [`EtcdServer::stop`] panic
//!   on a shared one.
//!
//! Without etcd these functions PANIC ("etcd not found: apt-get install etcd-server, or set
//! KVDIR_TEST_ETCD"); a test that needs etcd never silently skips.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::scratch::{free_port, fresh_dir};
use kvdir_sim::http;

/// Environment variable naming a running etcd (`host:port`) for tests.
pub const ENV_VAR: &str = "KVDIR_TEST_ETCD";
/// The longest wait for a spawned etcd to answer `/health`.
pub const START_DEADLINE: Duration = Duration::from_secs(10);
/// The panic message when no etcd can be had.
pub const NOT_FOUND: &str = "etcd not found: apt-get install etcd-server, or set KVDIR_TEST_ETCD";
/// Spawn attempts with fresh ports (a free port can be taken between probe and bind).
const SPAWN_ATTEMPTS: u32 = 3;

/// An etcd server for one test.
#[derive(Debug)]
pub struct EtcdServer {
    /// The client endpoint, `host:port` (for `kvdir_sim::RegistrationOptions::etcd`).
    pub endpoint: String,
    private: Option<Private>,
}

#[derive(Debug)]
struct Private {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

/// The etcd named by `KVDIR_TEST_ETCD` when set, else a private one ([`EtcdServer::private`]).
pub fn etcd_endpoint() -> EtcdServer {
    match std::env::var(ENV_VAR) {
        Ok(endpoint) if !endpoint.trim().is_empty() => {
            EtcdServer { endpoint: endpoint.trim().to_string(), private: None }
        }
        _ => EtcdServer::private(),
    }
}

impl EtcdServer {
    /// Spawns a private etcd and waits until it is healthy. Panics when that fails.
    pub fn private() -> EtcdServer {
        let mut failures = Vec::new();
        for _attempt in 0..SPAWN_ATTEMPTS {
            let client_port = free_port();
            let peer_port = (0..10).map(|_| free_port()).find(|p| *p != client_port).unwrap_or(0);
            // A failed attempt's directory goes with it (Drop), also when spawning panics.
            let mut private =
                Private { child: None, dir: fresh_dir("etcd"), client_port, peer_port };
            match private.start() {
                Ok(()) => {
                    let endpoint = format!("127.0.0.1:{client_port}");
                    return EtcdServer { endpoint, private: Some(private) };
                }
                Err(e) => failures.push(format!("{e}; log tail:\n{}", private.log_tail())),
            }
        }
        panic!("etcd did not start:\n{}", failures.join("\n"));
    }

    /// Whether this test owns the server (it can be stopped and restarted).
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }

    /// Kills etcd (SIGKILL) and starts it again on the same ports and data directory; returns
    /// once it is healthy. Works after [`EtcdServer::stop`] too. Panics on a shared server.
    pub fn restart(&mut self) {
        let private = self.private_mut("restart");
        private.kill();
        if let Err(e) = private.start() {
            panic!("etcd did not restart: {e}; log tail:\n{}", private.log_tail());
        }
    }

    /// Kills etcd and leaves it down (the data directory is kept for a later `restart`).
    /// Panics on a shared server.
    pub fn stop(&mut self) {
        self.private_mut("stop").kill();
    }

    fn private_mut(&mut self, what: &str) -> &mut Private {
        match self.private.as_mut() {
            Some(private) => private,
            None => panic!(
                "cannot {what} the shared etcd at {} (from {ENV_VAR}); \
                 tests that {what} etcd must use EtcdServer::private()",
                self.endpoint
            ),
        }
    }
}

impl Drop for Private {
    /// Kills etcd and removes its directory.
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Private {
    /// Spawns etcd and waits for `/health`; on failure the process is killed.
    fn start(&mut self) -> Result<(), String> {
        self.child = Some(self.spawn()?);
        let result = self.wait_healthy();
        if result.is_err() {
            self.kill();
        }
        result
    }

    fn spawn(&self) -> Result<Child, String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .map_err(|e| format!("cannot open the etcd log in {}: {e}", self.dir.display()))?;
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let spawned = Command::new("etcd")
            .arg("--name=kvdir-test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=kvdir-test={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        match spawned {
            Ok(child) => Ok(child),
            Err(e) if e.kind() == ErrorKind::NotFound => panic!("{NOT_FOUND}"),
            Err(e) => panic!("{NOT_FOUND} (spawning `etcd` failed: {e})"),
        }
    }

    /// Polls `GET /health` until it reports healthy, the process exits, or the deadline.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let addr = format!("127.0.0.1:{}", self.client_port);
        let deadline = Instant::now() + START_DEADLINE;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("etcd on {addr} exited with {status}"));
            }
            let health = http::request(&addr, "GET", "/health", &[], None, Duration::from_secs(1));
            if health.is_ok_and(|r| r.status == 200 && r.body.contains("true")) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Err(format!("etcd on {addr} was not healthy within {START_DEADLINE:?}"))
    }

    /// The last 20 lines of the etcd log.
    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already exited is fine; wait reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
