//! The bind endpoint's ports on an I/O thread: each port's SUB socket is in the thread's
//! `epoll` (its `ZMQ_FD`, edge-triggered, under a token of its own), and a ready port is read
//! in bounded bursts, each message received into the port's reused frames and handed in place
//! to the bound stream its route names, which decodes it at once and then has its turn (one
//! publish for all it took). Every bound stream of the port's rank is pinned to this thread,
//! so no message crosses a thread or a socket on its way to its stream, and none is copied.
//! As with a stream's sockets, a port stays in the ready set while `ZMQ_EVENTS` says it holds
//! input.

use std::collections::HashMap;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::stream::frames::Frames;
use crate::stream::sockets::Socket;
use crate::stream::BindRoutes;

/// Messages read from one port per turn, so the thread's streams get their turns too.
const PORT_BURST: usize = 1024;
/// Ports one thread can own (the bind endpoint's ranks are fewer).
const MAX_PORTS: usize = 4096;

/// The token of port `i` (stream tokens are stream ids, far below these).
pub(super) fn token(i: usize) -> Token {
    Token(usize::MAX - 1 - i)
}

/// The port index of a token, when it is a port's.
pub(super) fn port_of(t: Token) -> Option<usize> {
    let i = (usize::MAX - 1).checked_sub(t.0)?;
    (i < MAX_PORTS).then_some(i)
}

/// One bound port.
pub(super) struct Port {
    rank: u32,
    socket: Socket,
    routes: BindRoutes,
    /// Whether it is due a read.
    pub(super) queued: bool,
    /// Its messages are received into these.
    frames: Frames,
}

/// The thread's ports, and which of its streams each bound key belongs to.
#[derive(Default)]
pub(super) struct Ports {
    pub(super) ports: Vec<Port>,
    /// A bound stream's key -> its stream id on this thread.
    pub(super) streams: HashMap<u64, u64>,
}

impl Ports {
    /// Takes rank `rank`'s port and registers it with the thread's `epoll`.
    pub(super) fn attach(
        &mut self,
        registry: &Registry,
        rank: u32,
        socket: Socket,
        routes: BindRoutes,
    ) {
        let i = self.ports.len();
        let registered = socket
            .get_fd()
            .map_err(std::io::Error::from)
            .and_then(|fd| registry.register(&mut SourceFd(&fd), token(i), Interest::READABLE));
        if let Err(e) = registered {
            tracing::error!(rank, error = %e, "cannot watch a kv_events_bind port; its engines' events are lost");
            return;
        }
        self.ports.push(Port { rank, socket, routes, queued: true, frames: Frames::default() });
    }

    /// Whether a port is due a read.
    pub(super) fn any_queued(&self) -> bool {
        self.ports.iter().any(|p| p.queued)
    }

    /// Reads a burst from port `i`: each message goes to `deliver(stream id, frames)`, in
    /// place; one whose topic names no stream is counted as unknown, and one for a stream not
    /// on this thread now (it restarts) is dropped: its snapshot covers it.
    pub(super) fn read(&mut self, i: usize, mut deliver: impl FnMut(u64, &Frames)) {
        let Some(port) = self.ports.get_mut(i) else { return };
        let mut handed = 0;
        for _ in 0..PORT_BURST {
            match port.frames.recv(&port.socket) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(error = %e, rank = port.rank, "kv_events_bind: cannot read a message");
                    break;
                }
            }
            let Some(topic) = port.frames.first() else { continue };
            match port.routes.lookup(topic, port.rank) {
                Some(key) => {
                    handed += 1;
                    if let Some(&id) = self.streams.get(&key) {
                        deliver(id, &port.frames);
                    }
                }
                None => port.routes.unknown(topic, port.rank),
            }
        }
        port.frames.release();
        port.routes.handed(handed);
        // After the burst's last receive, as `ZMQ_FD`'s edge trigger requires.
        port.queued = port.socket.get_events().is_ok_and(|e| e.contains(zmq::POLLIN));
    }
}
