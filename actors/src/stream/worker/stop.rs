//! [`Stop`]: a stream thread's stop flag plus a wake-up. The thread blocks in `zmq_poll` with no
//! timeout while nothing is due (an idle stream costs no wake-ups at all); setting the flag also
//! writes a byte to a socket pair whose other end is in that poll, so the thread sees it at
//! once.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The stopping side, shared by whoever may stop the thread.
#[derive(Debug)]
pub struct Stop {
    flag: AtomicBool,
    wake: UnixStream,
}

/// The thread's side: the socket it polls.
#[derive(Debug)]
pub struct StopListener {
    rx: UnixStream,
}

impl Stop {
    /// A fresh, unset stop and its listener; fails only without file descriptors.
    pub fn pair() -> std::io::Result<(Arc<Stop>, StopListener)> {
        let (wake, rx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok((Arc::new(Stop { flag: AtomicBool::new(false), wake }), StopListener { rx }))
    }

    /// Sets the flag and wakes the thread.
    pub fn set(&self) {
        self.flag.store(true, Ordering::Release);
        // A full socket buffer means a wake-up is pending already.
        let _ = (&self.wake).write(&[1]);
    }

    /// Whether the flag is set.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

impl StopListener {
    /// The descriptor to poll for reading.
    pub fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    /// Consumes pending wake-ups.
    pub fn drain(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            match self.rx.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}
