//! The ZeroMQ context of the streams, sized for `max_streams`, and the process's open-file
//! limit.
//!
//! libzmq allows 1,023 sockets per context unless `ZMQ_MAX_SOCKETS` is set before the first
//! socket, and the `zmq` crate offers no setter, so [`ZmqContext`] makes the context itself
//! (through `zmq-sys`) and hands out ordinary [`zmq::Socket`]s that keep it alive. The limit
//! is the descriptor budget's ([`FdBudget::zmq_sockets`]): libzmq counts a closed socket until
//! its reaper has destroyed it, with its descriptors, so the limit bounds what closing DEALERs
//! hold too, and a socket beyond it fails with `EMFILE` like a missing descriptor. A stream
//! costs about four sockets (SUB, monitor pair, DEALER while replaying) and four file
//! descriptors (the SUB's mailbox and TCP connection, two for the monitor), two more while a
//! replay DEALER is open; a stream on the bind endpoint has no socket of its own, and its
//! engine's connection to the bound port is its one descriptor.
//! [`plan_fds`] lifts the soft `RLIMIT_NOFILE` to the hard one at start and plans what it holds
//! ([`FdBudget`]); [`describe`] turns `EMFILE` into a message naming the limit and the fix.
//!
//! The only unsafe code of the service: six libzmq calls (context new, set, term; socket; the
//! socket option `ZMQ_TCP_MAXRT` and stopping a socket monitor, which the `zmq` crate lacks),
//! each with its contract stated where it is made. The context runs libzmq's default one I/O
//! thread: with no ZMTP heartbeats (a connected publisher's liveness is TCP keepalive, kept by
//! the kernel), every more thread would only be another one to wake.

#![allow(unsafe_code)]

use std::ops::Deref;
use std::os::raw::c_void;
use std::sync::Arc;

use kvdir::config::fds::{FdBudget, StreamKind};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

struct RawContext(*mut c_void);

// SAFETY: a libzmq context is thread safe (zmq_ctx_new(3)).
unsafe impl Send for RawContext {}
unsafe impl Sync for RawContext {}

impl Drop for RawContext {
    fn drop(&mut self) {
        // Every socket holds a reference, so none is open any more; EINTR is retried.
        // SAFETY: the last reference to a live context ends it, once.
        while unsafe { zmq_sys::zmq_ctx_term(self.0) } == -1 {
            if errno() != zmq::Error::EINTR {
                break;
            }
        }
    }
}

/// The streams' ZeroMQ context (cheap to clone; the last clone and socket end it).
#[derive(Clone)]
pub struct ZmqContext(Arc<RawContext>);

/// A socket of a [`ZmqContext`]; closed before the context it keeps alive.
pub struct Socket {
    socket: zmq::Socket,
    _context: Arc<RawContext>,
}

impl Deref for Socket {
    type Target = zmq::Socket;
    fn deref(&self) -> &zmq::Socket {
        &self.socket
    }
}

impl Socket {
    /// Stops the socket monitor started with `monitor` (`zmq_socket_monitor` with no
    /// endpoint). libzmq's I/O thread sends a monitored socket's events with a blocking send,
    /// until the socket is destroyed, seconds after it is closed: had the monitor's reader
    /// closed first and the connection then failed, the send would wait for a reader for ever
    /// and every socket of the context would stop (issue 36, run C: replay DEALERs never
    /// destroyed, descriptors run out). Stopping the monitor first closes libzmq's end.
    pub fn stop_monitor(&mut self) {
        // SAFETY: a live socket (this handle owns it, open until dropped); a null endpoint
        // is the documented way to stop monitoring.
        let rc =
            unsafe { zmq_sys::zmq_socket_monitor(self.socket.as_mut_ptr(), std::ptr::null(), 0) };
        if rc != 0 {
            tracing::warn!(error = %errno(), "cannot stop a socket monitor");
        }
    }

    /// `ZMQ_TCP_MAXRT`: on Linux the `TCP_USER_TIMEOUT` of the socket's connections, which
    /// drops a connection whose data stays unacknowledged for `ms` (a vanished host), and
    /// bounds a keepalive's wait the same way; 0 leaves the system's (about 15 minutes).
    pub fn set_tcp_maxrt(&mut self, ms: i32) -> Result<(), zmq::Error> {
        let option = zmq_sys::ZMQ_TCP_MAXRT as i32;
        let (value, size) = (&ms as *const i32 as *const c_void, std::mem::size_of::<i32>());
        // SAFETY: a live socket (this handle owns it, open until dropped), and an int option
        // read from a pointer to an int that outlives the call.
        if unsafe { zmq_sys::zmq_setsockopt(self.socket.as_mut_ptr(), option, value, size) } == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }
}

impl ZmqContext {
    /// A context allowing `sockets` sockets at once, open or closed but not yet destroyed
    /// ([`FdBudget::zmq_sockets`]).
    pub fn new(sockets: usize) -> ZmqContext {
        // SAFETY: no precondition; a null result is checked.
        let ctx = unsafe { zmq_sys::zmq_ctx_new() };
        assert!(!ctx.is_null(), "libzmq cannot create a context (out of memory)");
        let sockets = sockets.min(i32::MAX as usize) as i32;
        let option = zmq_sys::ZMQ_MAX_SOCKETS as i32;
        // SAFETY: `ctx` is a live context with no socket yet, as ZMQ_MAX_SOCKETS requires.
        if unsafe { zmq_sys::zmq_ctx_set(ctx, option, sockets) } != 0 {
            tracing::warn!(sockets, "libzmq refused ZMQ_MAX_SOCKETS; it allows 1023 sockets");
        }
        ZmqContext(Arc::new(RawContext(ctx)))
    }

    /// A new socket of `kind`.
    pub fn socket(&self, kind: zmq::SocketType) -> Result<Socket, zmq::Error> {
        // `SocketType`'s discriminants are libzmq's socket type numbers (PAIR 0 .. STREAM 11).
        // SAFETY: the context is alive (this handle holds it) and not terminated.
        let raw = unsafe { zmq_sys::zmq_socket(self.0 .0, kind as i32) };
        if raw.is_null() {
            return Err(errno());
        }
        // SAFETY: `raw` is a socket libzmq just made, owned by nothing else; the `Socket`
        // closes it when dropped, before its reference to the context goes.
        let socket = unsafe { zmq::Socket::from_raw(raw) };
        Ok(Socket { socket, _context: Arc::clone(&self.0) })
    }
}

/// libzmq's error of the calling thread.
fn errno() -> zmq::Error {
    // SAFETY: reads a thread-local value.
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

/// `ZMQ_MAXMSGSIZE` of every socket receiving engine messages: a hard ceiling above the
/// configured limit. Payloads between the two get a readable "exceeds max_message_bytes" error
/// from the decoder; beyond it libzmq drops the peer.
pub fn max_frame(limits: &kvdir::config::Limits) -> i64 {
    (limits.max_message_bytes as i64).saturating_mul(2).saturating_add(64 << 10)
}

/// The soft and hard `RLIMIT_NOFILE` (`None`: unlimited).
pub fn fd_limit() -> (Option<u64>, Option<u64>) {
    let lim = getrlimit(Resource::Nofile);
    (lim.current, lim.maximum)
}

/// Raises the soft open-file limit to the hard one (no privilege needed); the soft limit in
/// force afterwards.
pub fn raise_fd_limit() -> Option<u64> {
    let lim = getrlimit(Resource::Nofile);
    if lim.current.is_some() && lim.current != lim.maximum {
        let raised = Rlimit { current: lim.maximum, maximum: lim.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(limit = ?lim, error = %e, "cannot raise the open-file limit");
            return lim.current;
        }
    }
    lim.maximum
}

/// Raises the soft open-file limit to the hard one and plans the descriptors of streams of
/// `kind`, their replays and `http_connections` under it ([`FdBudget`]).
pub fn plan_fds(
    limits: &kvdir::config::Limits,
    http_connections: u64,
    kind: StreamKind,
) -> FdBudget {
    FdBudget::plan(raise_fd_limit(), limits, http_connections, kind)
}

/// A stream's failure as reported: `EMFILE` names the limits and the fix.
pub fn describe(e: zmq::Error) -> String {
    if e != zmq::Error::EMFILE {
        return e.to_string();
    }
    let limit = fd_limit().0.map_or("unlimited".to_string(), |soft| soft.to_string());
    format!(
        "{e}: the open-file limit ({limit}) or the ZeroMQ socket limit is reached; each stream \
         kvdir connects to needs about 4 file descriptors (1 on the bind endpoint), 2 more while \
         replaying: raise the limit (ulimit -n) or run fewer streams (max_streams)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::pool::is_out_of_fds;

    #[test]
    fn a_socket_beyond_the_budget_fails_like_a_missing_descriptor_until_one_is_destroyed() {
        let zmq = ZmqContext::new(3);
        let mut held: Vec<Socket> = (0..3).map(|_| zmq.socket(zmq::DEALER).unwrap()).collect();
        let e = zmq.socket(zmq::DEALER).err().expect("the fourth socket is over the limit");
        assert!(is_out_of_fds(e), "{e}: a stream waits for it as for a descriptor");
        held.pop();
        // libzmq frees the slot once its reaper has destroyed the closed socket.
        kvdir_testkit::eventually("the closed socket's slot to come back", || {
            zmq.socket(zmq::DEALER).map(drop).map_err(|e| e.to_string())
        });
    }

    /// A SUB of `zmq` subscribed to everything and connected to a new PUB of another context.
    fn subscribed(zmq: &ZmqContext, other: &zmq::Context) -> (Socket, zmq::Socket) {
        let publisher = other.socket(zmq::PUB).unwrap();
        publisher.set_linger(0).unwrap();
        publisher.bind("tcp://127.0.0.1:0").unwrap();
        let sub = zmq.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.connect(&publisher.get_last_endpoint().unwrap().unwrap()).unwrap();
        (sub, publisher)
    }

    #[test]
    fn a_monitor_stopped_before_its_reader_closes_leaves_libzmq_running_when_the_peer_goes() {
        // Dropped only at the end: a context whose I/O thread is stuck never terminates.
        let zmq = std::mem::ManuallyDrop::new(ZmqContext::new(16));
        let other = zmq::Context::new();
        let (mut sub, publisher) = subscribed(&zmq, &other);
        let events =
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32 | zmq::SocketEvent::DISCONNECTED as i32;
        sub.monitor("inproc://sockets-test-monitor", events).unwrap();
        let monitor = zmq.socket(zmq::PAIR).unwrap();
        monitor.connect("inproc://sockets-test-monitor").unwrap();
        kvdir_testkit::eventually("the handshake event", || {
            monitor.recv_multipart(zmq::DONTWAIT).map(drop).map_err(|e| e.to_string())
        });
        // A stream stopped as its publisher goes: the reader closes, then the connection
        // fails. Without the stop, libzmq's I/O thread waits for ever to send the disconnect.
        sub.stop_monitor();
        drop(monitor);
        drop(publisher);
        let (next, publisher) = subscribed(&zmq, &other);
        kvdir_testkit::eventually("a new connection to carry a message", || {
            publisher.send("x", 0).unwrap();
            next.recv_bytes(zmq::DONTWAIT).map_err(|e| e.to_string())
        });
        drop((sub, next));
        drop(std::mem::ManuallyDrop::into_inner(zmq));
    }
}
