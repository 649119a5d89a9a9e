//! kvdir's own listener on a bind endpoint's port at an IP address, and the engines'
//! connections it accepted, read by the port's I/O thread (`ports.rs`).
//!
//! Through a libzmq SUB socket bound on the port, every message woke libzmq's I/O thread
//! (which read the connection and signalled the socket's mailbox) and then the pool thread:
//! the largest part of a bound stream's cost per batch (BENCHMARKS.md). Here the pool thread
//! accepts each connection and reads it itself with kvdir's ZMTP reader (a SUB's side,
//! subscribed to every topic, as the bound socket was): every connection that became readable
//! in one wake-up, one `read` each. A connection that fails its handshake or sends garbage is
//! closed, and the engine's libzmq PUB connects again; the other connections go on.
//!
//! An accept that finds no descriptor (`EMFILE`, `ENFILE`) or no memory leaves the connection
//! in the kernel's backlog and tries again after a back-off (200 ms doubling to 5 s, counted
//! and logged once a minute as a stream short of a descriptor is): with an edge-triggered
//! `epoll` the listener would not fire again for what is queued, and retrying at once would spin.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvdir::backoff::Backoff;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use rustix::io::Errno;

use super::fds::{fd_backoff, FdWaits};
use super::ports::{Cached, PORT_BURST};
use crate::stream::zmtp::{Conn, Step};

/// Connections accepted per turn, so a storm of connects does not starve the thread's reads.
const ACCEPT_BURST: usize = 256;
/// Connections the kernel queues for an accept (clipped to `net.core.somaxconn`): a fleet's
/// engines connect at once when kvdir starts (libzmq's listener queues 100).
const BACKLOG: i32 = 4096;

/// A port kvdir listens on itself.
pub struct Listener {
    listener: TcpListener,
    /// The largest frame a connection may send, and the publisher timeout (TCP keepalive).
    max_frame: u64,
    timeout: Duration,
    backoff: Backoff,
    /// An accept failed for want of a descriptor: when it is tried again.
    retry: Option<Instant>,
}

/// What an accept burst left: whether more may be waiting, and a retry to schedule.
pub(super) struct Accepts {
    pub(super) more: bool,
    pub(super) retry: Option<Instant>,
}

impl Listener {
    /// Listens on `addr` (`SO_REUSEADDR` set, as libzmq's listener does).
    pub fn bind(addr: SocketAddr, max_frame: u64, timeout: Duration) -> std::io::Result<Self> {
        let listener = listen(addr)?;
        let (backoff, retry) = (fd_backoff(), None);
        Ok(Listener { listener, max_frame, timeout, backoff, retry })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub(super) fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        registry.register(&mut self.listener, token, Interest::READABLE)
    }

    /// The pending retry, if any.
    pub(super) fn retry(&self) -> Option<Instant> {
        self.retry
    }

    /// Whether the retry at `at` is the pending one (it is then due: accept again).
    pub(super) fn retry_due(&mut self, at: Instant) -> bool {
        let due = self.retry == Some(at);
        if due {
            self.retry = None;
        }
        due
    }

    /// Accepts a burst of connections, each handed to `add`; on rank `rank`'s port.
    pub(super) fn accept(
        &mut self,
        rank: u32,
        now: Instant,
        fds: &FdWaits,
        mut add: impl FnMut(TcpStream, SocketAddr, (u64, Duration)) -> Option<()>,
    ) -> Accepts {
        if self.retry.is_some_and(|at| now < at) {
            // Waiting out a back-off: the timer brings the listener back.
            return Accepts { more: false, retry: None };
        }
        for _ in 0..ACCEPT_BURST {
            match self.listener.accept() {
                Ok((stream, addr)) => {
                    self.backoff.reset();
                    let _ = add(stream, addr, (self.max_frame, self.timeout));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Accepts { more: false, retry: None };
                }
                Err(e) if transient(&e) => {}
                Err(e) => {
                    let at = now + self.backoff.next_delay();
                    self.retry = Some(at);
                    self.starved(rank, e, fds);
                    return Accepts { more: false, retry: Some(at) };
                }
            }
        }
        Accepts { more: true, retry: None }
    }

    /// An accept failed: short of descriptors (counted and logged as a stream's wait), or
    /// something else (logged).
    fn starved(&self, rank: u32, e: std::io::Error, fds: &FdWaits) {
        match Errno::from_io_error(&e) {
            Some(errno @ (Errno::MFILE | Errno::NFILE)) => {
                let short = zmq::Error::from_raw(errno.raw_os_error());
                fds.starved("kv_events_bind", rank, "accept", short);
            }
            _ => {
                tracing::warn!(rank, error = %e, "kv_events_bind: cannot accept a connection; retrying after a back-off")
            }
        }
    }
}

/// A non-blocking listening socket on `addr`, its backlog [`BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    let fd = rustix::net::socket_with(family, SocketType::STREAM, flags, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, BACKLOG)?;
    Ok(TcpListener::from_std(std::net::TcpListener::from(fd)))
}

/// An accept error about that one connection (it went away meanwhile), not the listener.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::Interrupted | K::ConnectionAborted | K::ConnectionReset)
        || matches!(Errno::from_io_error(e), Some(Errno::PROTO | Errno::PERM))
}

/// An engine's connection to a port.
pub(super) struct Accepted {
    /// The index of its port on the thread.
    pub(super) port: usize,
    pub(super) conn: Box<Conn>,
    /// Whether it is in the ready list.
    pub(super) queued: bool,
    /// Where its last message went.
    cached: Option<Cached>,
}

impl Accepted {
    /// The connection `stream` from `addr` to port `port`, greeting at once; `None` (the
    /// connection closed) when it cannot be watched.
    pub(super) fn new(
        stream: TcpStream,
        addr: SocketAddr,
        port: usize,
        (max_frame, timeout): (u64, Duration),
        reach: (&Registry, Token),
    ) -> Option<Accepted> {
        match Conn::accepted(stream, addr, max_frame, timeout, reach) {
            Ok(conn) => Some(Accepted { port, conn: Box::new(conn), queued: true, cached: None }),
            Err(e) => {
                tracing::warn!(peer = %addr, error = %e, "kv_events_bind: cannot watch a connection; closed");
                None
            }
        }
    }

    /// Reads a burst of messages, each handed to `message` with the connection's cached
    /// route; the sum of what it returned.
    pub(super) fn read(
        &mut self,
        now: Instant,
        (registry, token): (&Registry, Token),
        mut message: impl FnMut(&[&[u8]], &mut Option<Cached>) -> u64,
    ) -> u64 {
        let mut handed = 0;
        let Accepted { conn, cached, .. } = self;
        conn.begin_turn();
        for _ in 0..PORT_BURST {
            match conn.next(now, registry, token) {
                Step::Idle => break,
                Step::Message => handed += conn.with_message(|parts| message(parts, cached)),
                Step::Connected => {
                    tracing::debug!(peer = %conn.peer(), "an engine connected to kv_events_bind")
                }
                Step::Disconnected(reason) => {
                    tracing::debug!(peer = %conn.peer(), %reason, "an engine's connection to kv_events_bind ended");
                }
            }
        }
        conn.end_turn();
        handed
    }
}
