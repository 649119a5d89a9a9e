//! The service's real tracing output, captured in memory for tests that read the log as an
//! operator would. The subscriber is process-wide: the first call in a test binary sets it.

use std::io::Write;
use std::sync::{Mutex, Once};

use tracing_subscriber::filter::LevelFilter;

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this test binary's log at `level` and above, as text without colours (once per
/// binary; later calls keep the first level).
pub fn capture_logs(level: LevelFilter) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(level)
            .try_init();
    });
}

/// Everything captured so far.
pub fn captured_log() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned()
}
