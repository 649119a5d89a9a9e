//! Where a stream's live messages come from ([`Live`]): its own connection to a `tcp://IP:PORT`
//! publisher, read by kvdir's ZMTP reader (`stream/zmtp`), a libzmq SUB socket (with the
//! monitor of its handshakes and disconnects) for other endpoints, or, on the bind endpoint,
//! the messages its I/O thread reads from the rank's port (`pool/ports.rs`). A bound stream holds no socket of its own:
//! its engine's connection is the port's, and the thread hands it each message as read, in
//! place ([`super::Worker::deliver`]); only a stream that cannot take one then (held by fault
//! injection, or with older ones queued) keeps a copy here, in order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kvdir::config::{is_bound, KEY_WIDTH};
use mio::{Registry, Token};

use super::open::{open_sub, register};
use super::{Worker, MAX_BURST};
use super::{WorkerCtx, SUB_HWM};
use crate::stream::frames::Frames;
use crate::stream::sockets::{max_frame, Socket};
use crate::stream::zmtp::{endpoint_addr, Conn, Step};

/// The bit a monitor's token adds to its stream's: the thread reads a monitor only when its
/// own `ZMQ_FD` fired, not in every turn of its stream.
const MONITOR: usize = 1 << 62;

/// The token of stream `id`'s socket monitor.
pub(super) fn monitor_token(id: u64) -> Token {
    Token(id as usize | MONITOR)
}

/// The stream a (non-port) token belongs to, and whether it is the stream's monitor's.
pub fn token_stream(t: Token) -> (u64, bool) {
    ((t.0 & !MONITOR) as u64, t.0 & MONITOR != 0)
}

/// A stream's live input.
pub(super) enum Live {
    /// kvdir connects to the publisher at an IP address: its own ZMTP reader (`None` only
    /// while a turn reads it).
    Zmtp(Option<Box<Conn>>),
    /// kvdir connects to the publisher through libzmq (an endpoint naming a host, or inproc).
    Socket {
        sub: Socket,
        /// Handshakes and disconnects of `sub`; none in process.
        monitor: Option<Socket>,
        /// Whether the last receive found `sub` empty: it then processed libzmq's commands
        /// as reading `ZMQ_EVENTS` would, so input arriving later fires `ZMQ_FD` again.
        drained: bool,
    },
    /// The engine connects to the bind endpoint.
    Bound {
        /// The stream's key in the route table.
        key: u64,
        /// The engine's topic (the stream's keyed topic without its key).
        topic: Vec<u8>,
        /// Messages the stream could not take when read, at most [`SUB_HWM`] (beyond it they
        /// are dropped, as a SUB socket beyond its high-water mark drops them: the next
        /// sequence is a gap).
        inbox: VecDeque<Vec<Vec<u8>>>,
    },
}

impl Live {
    /// Opens the stream's live input; a socket's are registered with `registry` as `token`.
    pub(super) fn open(
        ctx: &WorkerCtx,
        id: u64,
        registry: &Arc<Registry>,
        token: Token,
    ) -> Result<Live, zmq::Error> {
        let spec = &ctx.spec;
        if is_bound(&spec.endpoint) {
            let key = spec.topic.get(..KEY_WIDTH).and_then(|k| u64::from_str_radix(k, 16).ok());
            // The stream set gives every bound stream a keyed topic.
            let key = key.ok_or(zmq::Error::EINVAL)?;
            let topic = spec.replay_topic().to_vec();
            return Ok(Live::Bound { key, topic, inbox: VecDeque::new() });
        }
        if let Some(addr) = endpoint_addr(&spec.endpoint) {
            let max = max_frame(&ctx.limits) as u64;
            let timeout = ctx.limits.publisher_timeout;
            return Ok(Live::Zmtp(Some(Box::new(Conn::sub(
                addr,
                spec.topic.as_bytes(),
                max,
                timeout,
            )))));
        }
        let (sub, monitor) = open_sub(ctx, id)?;
        register(registry, &sub, token)?;
        if let Some(m) = &monitor {
            register(registry, m, monitor_token(id))?;
        }
        Ok(Live::Socket { sub, monitor, drained: false })
    }

    /// Receives the next message of a SUB socket into `frames`; `false` when none is there
    /// (and always for a bound stream: its thread hands it its messages).
    pub(super) fn recv(&mut self, frames: &mut Frames) -> Result<bool, zmq::Error> {
        let Live::Socket { sub, drained, .. } = self else { return Ok(false) };
        let got = frames.recv(sub)?;
        *drained = !got;
        Ok(got)
    }

    /// The oldest message a bound stream queued, if any.
    pub(super) fn queued(&mut self) -> Option<Vec<Vec<u8>>> {
        match self {
            Live::Bound { inbox, .. } => inbox.pop_front(),
            Live::Socket { .. } | Live::Zmtp(_) => None,
        }
    }

    /// Whether a bound stream has messages queued (a new one must queue behind them).
    pub(super) fn has_queued(&self) -> bool {
        matches!(self, Live::Bound { inbox, .. } if !inbox.is_empty())
    }

    /// The topic live messages carry.
    pub(super) fn topic<'a>(&'a self, ctx: &'a WorkerCtx) -> &'a [u8] {
        match self {
            Live::Socket { .. } | Live::Zmtp(_) => ctx.spec.topic.as_bytes(),
            Live::Bound { topic, .. } => topic,
        }
    }

    /// The socket monitor, if any.
    pub(super) fn monitor(&self) -> Option<&Socket> {
        match self {
            Live::Socket { monitor, .. } => monitor.as_ref(),
            Live::Bound { .. } | Live::Zmtp(_) => None,
        }
    }

    /// When a ZMTP connection has something to do without input (a reconnect, a timeout).
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self {
            Live::Zmtp(Some(conn)) => conn.deadline(),
            _ => None,
        }
    }

    /// Whether input is waiting (`ZMQ_EVENTS` of the SUB socket, read after the turn's last
    /// receive, as `ZMQ_FD`'s edge trigger requires, unless that receive found it empty; the
    /// monitor is read to empty whenever its own `ZMQ_FD` fires).
    pub(super) fn readable(&self) -> Result<bool, zmq::Error> {
        match self {
            Live::Socket { drained: true, .. } => Ok(false),
            Live::Socket { sub, .. } => Ok(sub.get_events()?.contains(zmq::POLLIN)),
            Live::Bound { inbox, .. } => Ok(!inbox.is_empty()),
            Live::Zmtp(conn) => Ok(conn.as_ref().is_some_and(|c| c.readable())),
        }
    }

    /// Whether the connection's losses come in order with its messages (kvdir's own ZMTP
    /// reader), so that a restarted publisher shows as a disconnect before its first batch.
    pub(super) fn orders_losses(&self) -> bool {
        matches!(self, Live::Zmtp(_))
    }

    /// A bound stream's key.
    pub(super) fn bound_key(&self) -> Option<u64> {
        match self {
            Live::Bound { key, .. } => Some(*key),
            Live::Socket { .. } | Live::Zmtp(_) => None,
        }
    }

    /// Queues a copy of a message the thread read for this (bound) stream.
    pub(super) fn queue(&mut self, frames: &[&[u8]]) {
        if let Live::Bound { inbox, .. } = self {
            if inbox.len() < SUB_HWM as usize {
                inbox.push_back(frames.iter().map(|f| f.to_vec()).collect());
            }
        }
    }
}

impl Worker {
    /// A turn of the stream's ZMTP connection, if it has one: connects when due, reads a
    /// bounded burst of messages (each decoded and applied in place), and reports its
    /// handshakes and losses to the recovery machine as the socket monitor did.
    pub(super) fn read_zmtp(&mut self, now: Instant) -> Result<(), zmq::Error> {
        let Live::Zmtp(slot) = &mut self.live else { return Ok(()) };
        let Some(mut conn) = slot.take() else { return Ok(()) };
        let read = self.zmtp_burst(&mut conn, now);
        conn.end_turn();
        self.live = Live::Zmtp(Some(conn));
        read
    }

    fn zmtp_burst(&mut self, conn: &mut Conn, now: Instant) -> Result<(), zmq::Error> {
        conn.begin_turn();
        for _ in 0..MAX_BURST {
            match conn.next(now, &self.registry, self.token) {
                Step::Idle => return Ok(()),
                Step::Message => conn.with_message(|parts| self.live_message(parts, now))?,
                Step::Connected => {
                    tracing::info!(endpoint = %self.ctx.spec.endpoint, "connected to publisher");
                    self.status.connected = true;
                    self.recovery.on_connected(now, &mut self.actions);
                    self.run_actions(now)?;
                }
                Step::Disconnected(reason) => {
                    tracing::warn!(endpoint = %self.ctx.spec.endpoint, %reason, "publisher disconnected");
                    self.status.connected = false;
                    self.recovery.on_disconnected(&mut self.actions);
                    self.run_actions(now)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Live {
    /// The SUB's monitor stops before the monitor's reader closes (`Socket::stop_monitor`):
    /// the fields drop in order, and libzmq would otherwise send a disconnect that comes
    /// meanwhile to a reader that is gone, stopping its I/O thread for good.
    fn drop(&mut self) {
        if let Live::Socket { sub, monitor: Some(_), .. } = self {
            sub.stop_monitor();
        }
    }
}
