//! The service's real tracing output, captured in memory for tests that read the log as an
//! operator would.
//!
//! The subscriber is process-wide, and every test of this binary runs in this process: a test
//! that reads the log counts only the lines naming its own streams, instances or endpoints. It
//! asks for the level it needs with a [`LogCapture`] guard; while guards are alive the capture
//! records at the most verbose level asked for, and with none alive it records nothing (so the
//! other tests neither pay for formatting nor fill the buffer).

use std::io::Write;
use std::sync::{Mutex, OnceLock, PoisonError};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, Registry};

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// The levels the live guards asked for.
static WANTED: Mutex<Vec<LevelFilter>> = Mutex::new(Vec::new());
/// The capture's level, changed as guards come and go.
static LEVEL: OnceLock<reload::Handle<LevelFilter, Registry>> = OnceLock::new();

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keeps the log captured at (at least) its level until dropped.
#[must_use = "the log is captured only while the guard is alive"]
pub struct LogCapture {
    level: LevelFilter,
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        let mut wanted = WANTED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = wanted.iter().position(|l| *l == self.level) {
            wanted.swap_remove(i);
        }
        set_level(&wanted);
    }
}

/// Captures the log at `level` and above, as text without colours, while the guard lives.
pub fn capture_logs(level: LevelFilter) -> LogCapture {
    let mut wanted = WANTED.lock().unwrap_or_else(PoisonError::into_inner);
    wanted.push(level);
    set_level(&wanted);
    LogCapture { level }
}

/// Sets the capture to the most verbose level `wanted` (nothing when empty), installing the
/// process's subscriber the first time.
fn set_level(wanted: &[LevelFilter]) {
    let level = wanted.iter().copied().max().unwrap_or(LevelFilter::OFF);
    let handle = LEVEL.get_or_init(|| {
        let (filter, handle) = reload::Layer::new(LevelFilter::OFF);
        let format = fmt::layer().with_writer(|| Capture).with_ansi(false);
        tracing_subscriber::registry().with(filter).with(format).try_init().ok();
        handle
    });
    handle.reload(level).expect("the capture's subscriber is installed");
}

/// Everything captured so far, by every test of this binary.
pub fn captured_log() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
}
