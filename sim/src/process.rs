//! [`ProcessStart`]: the simulated engine process's start time, which vLLM exports as
//! `process_start_time_seconds` and kvdir reads to tell one engine process from the next.
//!
//! The value is wall-clock seconds rounded to hundredths (the `/proc` clock tick a real process
//! reports), set when the engine starts and moved forward by every rank restart, always by at
//! least one tick, so a restarted engine never shows its previous value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// One tick of the reported start time, in hundredths of a second.
const TICK: u64 = 1;

/// The engine's start time, shared by its ranks (which restart it) and its HTTP server.
#[derive(Debug)]
pub(crate) struct ProcessStart {
    /// Hundredths of a second since the Unix epoch.
    centis: AtomicU64,
}

impl ProcessStart {
    /// Starts now.
    pub(crate) fn now() -> ProcessStart {
        ProcessStart { centis: AtomicU64::new(now_centis()) }
    }

    /// A new process: now, or one tick after the previous start when the clock has not moved.
    pub(crate) fn restart(&self) {
        let now = now_centis();
        let _ = self.centis.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |previous| {
            Some(now.max(previous + TICK))
        });
    }

    /// Seconds since the Unix epoch.
    pub(crate) fn seconds(&self) -> f64 {
        self.centis.load(Ordering::SeqCst) as f64 / 100.0
    }
}

fn now_centis() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    since.as_secs() * 100 + u64::from(since.subsec_millis() / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restart_moves_the_start_forward() {
        let start = ProcessStart::now();
        let first = start.seconds();
        assert!(first > 1.0e9, "{first} is not a Unix time");
        start.restart();
        let second = start.seconds();
        start.restart();
        assert!(second > first && start.seconds() > second);
    }
}
