//! What `/metrics` shows of file descriptors and HTTP connections: the process's open
//! descriptors and limit (`process_open_fds`, `process_max_fds`, the names Prometheus clients
//! use), streams short of one ([`crate::stream::PoolStats`]), and the HTTP connections open now,
//! at most so far and accepted in all ([`Connections`], counted by a guard each connection
//! holds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvdir::metrics::{Exposition, Kind};

use crate::stream::PoolStats;

/// HTTP connections open now and at most so far.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicU64,
    peak: AtomicU64,
    accepted: AtomicU64,
}

/// Held by one open connection (in its extensions); dropping it counts the connection closed.
pub struct OpenConnection(Arc<super::ServiceMetrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl super::ServiceMetrics {
    /// Counts a new connection, open until the guard is dropped.
    pub fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.accepted.fetch_add(1, Ordering::Relaxed);
        let open = self.connections.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.connections.peak.fetch_max(open, Ordering::Relaxed);
        OpenConnection(Arc::clone(self))
    }
}

impl Connections {
    /// `(open now, most open at once so far)`.
    pub fn counts(&self) -> (u64, u64) {
        (self.open.load(Ordering::Relaxed), self.peak.load(Ordering::Relaxed))
    }
}

/// Descriptors open in this process (entries of `/proc/self/fd`, less the one reading it).
pub fn open_fds() -> Option<u64> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(n.saturating_sub(1))
}

/// Renders the descriptor and connection families.
pub fn render(e: &mut Exposition, connections: &Connections, pool: &PoolStats) {
    if let Some(n) = open_fds() {
        e.family("process_open_fds", Kind::Gauge, "Number of open file descriptors.");
        e.sample("process_open_fds", &[], n as f64);
    }
    if let (Some(limit), _) = crate::stream::fd_limit() {
        e.family("process_max_fds", Kind::Gauge, "Maximum number of open file descriptors.");
        e.sample("process_max_fds", &[], limit as f64);
    }
    let help = "Times a stream or its replay found no file descriptor and waited (200 ms \
                doubling to 5 s) before trying again.";
    e.family("kvdir_fd_waits_total", Kind::Counter, help);
    e.sample("kvdir_fd_waits_total", &[], pool.fd_waits as f64);
    let help = "Streams waiting for file descriptors to open their sockets.";
    e.family("kvdir_streams_waiting_for_fds", Kind::Gauge, help);
    e.sample("kvdir_streams_waiting_for_fds", &[], pool.streams_waiting_for_fds as f64);
    let (open, peak) = connections.counts();
    let help = "HTTP connections open (--http_max_connections caps them).";
    e.family("kvdir_http_connections", Kind::Gauge, help);
    e.sample("kvdir_http_connections", &[], open as f64);
    let help = "Most HTTP connections open at once since kvdir started.";
    e.family("kvdir_http_connections_peak", Kind::Gauge, help);
    e.sample("kvdir_http_connections_peak", &[], peak as f64);
    let help = "HTTP connections accepted since kvdir started.";
    e.family("kvdir_http_connections_total", Kind::Counter, help);
    e.sample(
        "kvdir_http_connections_total",
        &[],
        connections.accepted.load(Ordering::Relaxed) as f64,
    );
}
