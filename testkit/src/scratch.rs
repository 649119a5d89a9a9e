//! What a test's private server needs from the machine: a fresh directory under the system
//! temp dir and a free 127.0.0.1 port (the private etcd and the kube-apiserver share these).

use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A new, empty directory `kvdir-<what>-<pid>-<n>-<nanos>` under the system temp dir.
pub(crate) fn fresh_dir(what: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("kvdir-{what}-{}-{n}-{nanos}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create the {what} directory {}: {e}", dir.display()));
    dir
}

/// A port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free 127.0.0.1 port: {e}"))
}
