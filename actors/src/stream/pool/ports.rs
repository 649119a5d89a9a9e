//! The bind endpoint's ports on an I/O thread, and the engines' connections to them. Each
//! message is handed in place to the bound stream its route names, which decodes it at once
//! and then has its turn (one publish for all it took). Every bound stream of the port's rank
//! is pinned to this thread, so no message crosses a thread on its way to its stream, and
//! none is copied.
//!
//! A port at an IP address (`tcp://IP:PORT`, `*` for every interface) is kvdir's own listener
//! (`listen.rs`): the thread accepts the engines' connections and reads each with the same
//! ZMTP reader as a stream it connects to (`stream/zmtp`), so a message costs no libzmq I/O
//! thread wake-up and mailbox signal. A port bound to an interface or host name is a libzmq
//! SUB socket, its `ZMQ_FD` (edge-triggered) in the thread's `epoll`, read in bounded bursts
//! into the port's reused frames; it stays in the ready set while `ZMQ_EVENTS` says it holds
//! input.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::fds::FdWaits;
use super::listen::{Accepted, Listener};
use super::timers::Timers;
use crate::stream::frames::Frames;
use crate::stream::sockets::Socket;
use crate::stream::BindRoutes;

/// Messages read from one port, or one engine's connection, per turn, so the thread's streams
/// get their turns too.
pub(super) const PORT_BURST: usize = 1024;
/// Ports one thread can own (the bind endpoint's ranks are fewer).
const MAX_PORTS: usize = 4096;
/// The bit of an accepted connection's token, and of its entry in the thread's timers.
const CONN: u64 = 1 << 61;
/// The bit of a listener's entry in the thread's timers (its accept retry).
const LISTENER: u64 = 1 << 60;

/// The token of port `i` (stream tokens are stream ids, far below these).
pub(super) fn token(i: usize) -> Token {
    Token(usize::MAX - 1 - i)
}

/// The port index of a token, when it is a port's.
pub(super) fn port_of(t: Token) -> Option<usize> {
    let i = (usize::MAX - 1).checked_sub(t.0)?;
    (i < MAX_PORTS).then_some(i)
}

/// The accepted connection of a (non-port) token, if it is one's.
pub(super) fn conn_of(t: Token) -> Option<u64> {
    let t = t.0 as u64;
    (t & CONN != 0).then_some(t & !CONN)
}

/// Whether an entry of the thread's timers is a port's (not a stream's).
pub(super) fn is_port_timer(id: u64) -> bool {
    id & (CONN | LISTENER) != 0
}

/// A bound port's socket, as `bind.rs` opened it.
pub enum PortSocket {
    /// A libzmq SUB socket (bound to an interface or host name).
    Zmq(Socket),
    /// kvdir's own listener.
    Tcp(Listener),
}

/// One bound port.
pub(super) struct Port {
    rank: u32,
    routes: BindRoutes,
    /// Whether it is due a read (or an accept).
    pub(super) queued: bool,
    source: Source,
}

enum Source {
    /// Its messages are received into the frames.
    Zmq {
        socket: Socket,
        frames: Frames,
    },
    Tcp(Listener),
}

/// What serving the ports needs of the thread.
pub(super) struct Reach<'a> {
    pub(super) registry: &'a Registry,
    pub(super) timers: &'a mut Timers,
    pub(super) fds: &'a FdWaits,
}

/// The thread's ports, the connections they accepted, and which of its streams each bound
/// key belongs to.
#[derive(Default)]
pub(super) struct Ports {
    pub(super) ports: Vec<Port>,
    /// A bound stream's key -> its stream id on this thread.
    streams: HashMap<u64, u64>,
    /// Bumped by every change of `streams` (see [`Cached`]).
    streams_version: u64,
    conns: HashMap<u64, Accepted>,
    /// Connections due a read.
    ready: VecDeque<u64>,
    next_conn: u64,
}

impl Ports {
    /// Takes rank `rank`'s port and registers it with the thread's `epoll`.
    pub(super) fn attach(
        &mut self,
        registry: &Registry,
        rank: u32,
        socket: PortSocket,
        routes: BindRoutes,
    ) {
        let i = self.ports.len();
        let (registered, source) = match socket {
            PortSocket::Zmq(socket) => {
                let registered = socket.get_fd().map_err(std::io::Error::from).and_then(|fd| {
                    registry.register(&mut SourceFd(&fd), token(i), Interest::READABLE)
                });
                (registered, Source::Zmq { socket, frames: Frames::default() })
            }
            PortSocket::Tcp(mut l) => (l.register(registry, token(i)), Source::Tcp(l)),
        };
        if let Err(e) = registered {
            tracing::error!(rank, error = %e, "cannot watch a kv_events_bind port; its engines' events are lost");
            return;
        }
        self.ports.push(Port { rank, routes, queued: true, source });
    }

    /// A bound stream's messages reach stream `id` on this thread.
    pub(super) fn bind_stream(&mut self, key: u64, id: u64) {
        self.streams.insert(key, id);
        self.streams_version += 1;
    }

    /// Stream `id` leaves: its key's messages are dropped (unless another stream took it).
    pub(super) fn unbind_stream(&mut self, key: u64, id: u64) {
        if self.streams.get(&key) == Some(&id) {
            self.streams.remove(&key);
            self.streams_version += 1;
        }
    }

    /// Whether a port or a connection is due a read.
    pub(super) fn any_queued(&self) -> bool {
        !self.ready.is_empty() || self.ports.iter().any(|p| p.queued)
    }

    /// A connection's socket fired: it is read in the next turn.
    pub(super) fn conn_fired(&mut self, id: u64) {
        if let Some(a) = self.conns.get_mut(&id) {
            if !std::mem::replace(&mut a.queued, true) {
                self.ready.push_back(id);
            }
        }
    }

    /// A port timer came due: a connection's handshake deadline or a listener's retry.
    pub(super) fn timer_due(&mut self, id: u64, at: Instant) {
        if id & CONN != 0 {
            if self.conns.get(&(id & !CONN)).is_some_and(|a| a.conn.deadline() == Some(at)) {
                self.conn_fired(id & !CONN);
            }
        } else if let Some(p) = self.ports.get_mut((id & !LISTENER) as usize) {
            if let Source::Tcp(l) = &mut p.source {
                p.queued |= l.retry_due(at);
            }
        }
    }

    /// Whether a port timer is still wanted (stale ones are dropped).
    pub(super) fn timer_wanted(&self, id: u64, at: Instant) -> bool {
        if id & CONN != 0 {
            return self.conns.get(&(id & !CONN)).is_some_and(|a| a.conn.deadline() == Some(at));
        }
        let port = self.ports.get((id & !LISTENER) as usize);
        port.is_some_and(|p| matches!(&p.source, Source::Tcp(l) if l.retry() == Some(at)))
    }

    /// Reads every port due a read, then every connection due one (each a bounded burst):
    /// each message goes to `deliver(stream id, frames)`, in place; one whose topic names no
    /// stream is counted as unknown, and one for a stream not on this thread now (it
    /// restarts) is dropped: its snapshot covers it.
    pub(super) fn serve(&mut self, reach: Reach, mut deliver: impl FnMut(u64, &[&[u8]])) {
        let now = Instant::now();
        for i in 0..self.ports.len() {
            if self.ports[i].queued {
                match self.ports[i].source {
                    Source::Zmq { .. } => self.read_zmq(i, &mut deliver),
                    Source::Tcp(_) => self.accept(i, now, reach.registry, reach.timers, reach.fds),
                }
            }
        }
        for _ in 0..self.ready.len() {
            let Some(id) = self.ready.pop_front() else { break };
            self.read_conn(id, now, reach.registry, &mut deliver);
        }
    }

    /// Reads a burst from libzmq port `i`.
    fn read_zmq(&mut self, i: usize, deliver: &mut impl FnMut(u64, &[&[u8]])) {
        let Port { rank, routes, queued, source } = &mut self.ports[i];
        let Source::Zmq { socket, frames } = source else { return };
        let mut handed = 0;
        for _ in 0..PORT_BURST {
            match frames.recv(socket) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(error = %e, rank, "kv_events_bind: cannot read a message");
                    break;
                }
            }
            handed += frames.with(|parts| route(&self.streams, routes, *rank, parts, deliver));
        }
        frames.release();
        routes.handed(handed);
        // After the burst's last receive, as `ZMQ_FD`'s edge trigger requires.
        *queued = socket.get_events().is_ok_and(|e| e.contains(zmq::POLLIN));
    }

    /// Accepts what listener `i` holds (a bounded burst); each connection is read at once.
    fn accept(
        &mut self,
        i: usize,
        now: Instant,
        registry: &Registry,
        timers: &mut Timers,
        fds: &FdWaits,
    ) {
        let Port { rank, queued, source, routes } = &mut self.ports[i];
        let Source::Tcp(listener) = source else { return };
        let next = &mut self.next_conn;
        let accepted = listener.accept(*rank, now, fds, |stream, addr, l| {
            *next += 1;
            let id = *next;
            let a = Accepted::new(stream, addr, i, l, (registry, Token((CONN | id) as usize)))?;
            if let Some(at) = a.conn.deadline() {
                timers.push(at, CONN | id);
            }
            self.conns.insert(id, a);
            self.ready.push_back(id);
            routes.connection(true);
            Some(())
        });
        *queued = accepted.more;
        if let Some(at) = accepted.retry {
            timers.push(at, LISTENER | i as u64);
        }
    }

    /// Reads a burst from connection `id`; a closed one is dropped.
    fn read_conn(
        &mut self,
        id: u64,
        now: Instant,
        registry: &Registry,
        deliver: &mut impl FnMut(u64, &[&[u8]]),
    ) {
        let Some(a) = self.conns.get_mut(&id) else { return };
        let Some(port) = self.ports.get(a.port) else { return };
        a.queued = false;
        let table = (&self.streams, self.streams_version);
        let token = Token((CONN | id) as usize);
        let handed = a.read(now, (registry, token), |parts, cached| {
            route_cached(cached, table, &port.routes, port.rank, parts, deliver)
        });
        port.routes.handed(handed);
        if a.conn.closed() {
            port.routes.connection(false);
            self.conns.remove(&id);
        } else if a.conn.readable() {
            a.queued = true;
            self.ready.push_back(id);
        }
    }
}

/// The stream an accepted connection's last message went to (an engine's connection carries
/// one topic): good while neither the route table nor the thread's streams changed, so a
/// message costs a comparison of its topic, not the table's lock and two hash lookups.
#[derive(Default)]
pub(super) struct Cached {
    topic: Vec<u8>,
    /// The versions it was looked up at.
    routes: u64,
    streams: u64,
    /// `None`: routed, to a stream not on this thread now (it restarts).
    stream: Option<u64>,
}

/// [`route`] through a connection's [`Cached`] route.
fn route_cached(
    cached: &mut Option<Cached>,
    (streams, streams_version): (&HashMap<u64, u64>, u64),
    routes: &BindRoutes,
    rank: u32,
    parts: &[&[u8]],
    deliver: &mut impl FnMut(u64, &[&[u8]]),
) -> u64 {
    let Some(topic) = parts.first() else { return 0 };
    let hit = cached.as_ref().filter(|c| {
        c.streams == streams_version && c.topic == *topic && c.routes == routes.version()
    });
    let stream = match hit {
        Some(c) => c.stream,
        None => {
            // The version first: a change after it makes the cached route stale.
            let version = routes.version();
            let Some(stream) = stream_for(streams, routes, topic, rank) else { return 0 };
            let c = cached.get_or_insert_with(Cached::default);
            c.topic.clear();
            c.topic.extend_from_slice(topic);
            (c.routes, c.streams, c.stream) = (version, streams_version, stream);
            c.stream
        }
    };
    if let Some(id) = stream {
        deliver(id, parts);
    }
    1
}

/// Hands one message on `rank`'s port to the stream its topic names; 1 when it names one.
fn route(
    streams: &HashMap<u64, u64>,
    routes: &BindRoutes,
    rank: u32,
    parts: &[&[u8]],
    deliver: &mut impl FnMut(u64, &[&[u8]]),
) -> u64 {
    let Some(topic) = parts.first() else { return 0 };
    let Some(stream) = stream_for(streams, routes, topic, rank) else { return 0 };
    if let Some(id) = stream {
        deliver(id, parts);
    }
    1
}

/// The stream `topic` names on `rank`'s port: `None` when it names none (counted as unknown),
/// `Some(None)` when it names one not on this thread now (it restarts).
fn stream_for(
    streams: &HashMap<u64, u64>,
    routes: &BindRoutes,
    topic: &[u8],
    rank: u32,
) -> Option<Option<u64>> {
    let Some(key) = routes.lookup(topic, rank) else {
        routes.unknown(topic, rank);
        return None;
    };
    Some(streams.get(&key).copied())
}
