//! [`HeldLogs`]: a log writer for stderr that holds every line back until the program's first
//! screen is out, so the demo's banner (the URLs to open) comes before the start-up logs of
//! its engines and HTTP servers instead of below a screenful of them.
//!
//! Held lines keep their order and are written, all at once, on [`HeldLogs::release`]; from
//! then on lines go straight to stderr. A start-up that logs more than [`MAX_HELD_BYTES`]
//! before its banner releases them early: memory stays bounded and nothing is lost.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

/// Log bytes held at most before they are released anyway.
pub const MAX_HELD_BYTES: usize = 1 << 20;

/// Log lines for stderr, held until [`HeldLogs::release`]; clones share the hold.
#[derive(Debug, Clone, Default)]
pub struct HeldLogs {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    released: AtomicBool,
    held: Mutex<Vec<u8>>,
}

impl HeldLogs {
    /// Writes the held lines to stderr; later lines go straight there. Idempotent.
    pub fn release(&self) {
        let mut held = lock(&self.inner.held);
        let _ = std::io::stderr().write_all(&held);
        *held = Vec::new();
        self.inner.released.store(true, Ordering::Release);
    }

    /// A writer for one log event (what `tracing_subscriber`'s `with_writer` asks for).
    pub fn writer(&self) -> HeldWriter {
        HeldWriter(self.clone())
    }
}

/// Writes one log event into a [`HeldLogs`].
#[derive(Debug)]
pub struct HeldWriter(HeldLogs);

impl Write for HeldWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let inner = &self.0.inner;
        if !inner.released.load(Ordering::Acquire) {
            let mut held = lock(&inner.held);
            // Checked again under the lock: a release in between has written what was held.
            if !inner.released.load(Ordering::Acquire) {
                held.extend_from_slice(buf);
                let full = held.len() > MAX_HELD_BYTES;
                drop(held);
                if full {
                    self.0.release();
                }
                return Ok(buf.len());
            }
        }
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
