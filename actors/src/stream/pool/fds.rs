//! Streams short of a file descriptor: a stream whose sockets (or replay DEALER) cannot open
//! because the process is at its open-file limit (`EMFILE`, `ENFILE`, or libzmq's socket limit)
//! waits on its I/O thread and tries again after a back-off, instead of failing and being
//! restarted by its actor in a loop. [`FdWaits`] counts those waits for `/metrics`, and logs one
//! WARN a minute at most, naming the limit and the fix.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvdir::backoff::Backoff;

use crate::stream::sockets::describe;
use crate::sync::lock;

/// First wait of a stream short of a descriptor; it doubles up to [`FD_RETRY_MAX`].
pub const FD_RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest wait between two tries.
pub const FD_RETRY_MAX: Duration = Duration::from_secs(5);
/// At most one WARN in this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Whether `e` means no descriptor (or libzmq socket) was left.
pub fn is_out_of_fds(e: zmq::Error) -> bool {
    e == zmq::Error::EMFILE || e.to_raw() == rustix::io::Errno::NFILE.raw_os_error()
}

/// The back-off of a stream short of a descriptor.
pub fn fd_backoff() -> Backoff {
    Backoff::new(FD_RETRY_MIN, FD_RETRY_MAX)
}

/// Waits for a descriptor, process-wide.
#[derive(Debug, Default)]
pub struct FdWaits {
    /// Times a stream or replay found no descriptor and backed off.
    waits: AtomicU64,
    /// Streams waiting now to open their sockets.
    waiting: AtomicUsize,
    last_warn: Mutex<Option<Instant>>,
}

impl FdWaits {
    /// A stream (or its replay, `what`) found no descriptor: counted, and logged once a minute.
    pub fn starved(&self, stream: &str, dp: u32, what: &str, e: zmq::Error) {
        let waits = self.waits.fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let mut last = lock(&self.last_warn);
        if last.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return;
        }
        *last = Some(now);
        let waiting = self.waiting.load(Ordering::Relaxed);
        tracing::warn!(
            %stream, dp, what, waits, waiting,
            "no file descriptor for a stream; it waits and tries again (200 ms doubling to 5 s), \
             and this is logged once a minute (kvdir_fd_waits_total counts them): {}",
            describe(e)
        );
    }

    /// A stream starts waiting to open its sockets.
    pub fn wait_started(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream stops waiting (opened, removed, or its thread ended).
    pub fn wait_ended(&self, n: usize) {
        self.waiting.fetch_sub(n, Ordering::Relaxed);
    }

    /// `(waits so far, streams waiting now)`.
    pub fn counts(&self) -> (u64, usize) {
        (self.waits.load(Ordering::Relaxed), self.waiting.load(Ordering::Relaxed))
    }
}
