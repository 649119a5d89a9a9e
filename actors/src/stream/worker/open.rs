//! Opening a worker's sockets: the SUB socket and its monitor, the fresh DEALER of each replay
//! request (once the stream holds a replay slot), and their `ZMQ_FD`s in the thread's `epoll`.
//! A DEALER that cannot open for want of a file descriptor is tried again after a back-off.

use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::{Socket, Worker, WorkerCtx, SUB_HWM};
use crate::faults::{self, FaultPoint};
use crate::stream::pool::is_out_of_fds;
use crate::stream::sockets::max_frame;

/// ZMTP heartbeats: a PING every two thirds of `timeout`, each to be answered within the
/// remaining third (at least 100 ms each), so a publisher silent for `timeout` is disconnected,
/// which the socket monitor reports. libzmq publishers answer PINGs without any option set.
/// Zero turns them off. Why not a PING every third with a whole `timeout` to answer: libzmq
/// cancels a PING's answer timer by walking its I/O thread's timers in order of expiry, and an
/// answer timer that expires after every connection's next PING walks them all; answered
/// within a third it walks half as many, and PINGs are half as frequent (about 3.5 times less
/// work, which grows with the square of the connections on a thread).
fn set_heartbeats(sub: &Socket, timeout: std::time::Duration) -> Result<(), zmq::Error> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    if timeout_ms == 0 {
        return Ok(());
    }
    let answer_ms = (timeout_ms / 3).max(100);
    sub.set_heartbeat_ivl((timeout_ms - answer_ms).max(100))?;
    sub.set_heartbeat_timeout(answer_ms)?;
    // Asks the publisher to drop this connection too if kvdir goes silent that long.
    sub.set_heartbeat_ttl(timeout_ms.clamp(100, 6_553_599))
}

/// The SUB socket, subscribed and connecting, and the monitor that reports its handshakes
/// and disconnects; an in-process SUB (the bind endpoint's fan-out) has neither handshakes nor
/// disconnects, so no monitor (two descriptors fewer a stream).
pub(super) fn open_sub(ctx: &WorkerCtx, id: u64) -> Result<(Socket, Option<Socket>), zmq::Error> {
    let sub = ctx.zmq.socket(zmq::SUB)?;
    sub.set_linger(0)?;
    sub.set_rcvhwm(SUB_HWM)?;
    sub.set_maxmsgsize(max_frame(&ctx.limits))?;
    if ctx.spec.endpoint.starts_with("inproc://") {
        sub.set_subscribe(ctx.spec.topic.as_bytes())?;
        sub.connect(&ctx.spec.endpoint)?;
        return Ok((sub, None));
    }
    sub.set_reconnect_ivl(100)?;
    sub.set_reconnect_ivl_max(2000)?;
    sub.set_affinity(ctx.zmq.affinity(id))?;
    set_heartbeats(&sub, ctx.limits.publisher_timeout)?;
    let mon_addr = format!("inproc://kvdir-monitor-{id}");
    // HANDSHAKE_SUCCEEDED, not CONNECTED: a TCP connect only reaches the nearest hop (a proxy
    // or a listen backlog). After the ZMTP handshake the subscription is on its way to the
    // publisher itself, so a snapshot taken from then on is not followed by events the
    // publisher drops for want of a subscriber.
    let events =
        zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32 | zmq::SocketEvent::DISCONNECTED as i32;
    sub.monitor(&mon_addr, events)?;
    let monitor = ctx.zmq.socket(zmq::PAIR)?;
    monitor.set_linger(0)?;
    monitor.connect(&mon_addr)?;
    sub.set_subscribe(ctx.spec.topic.as_bytes())?;
    sub.connect(&ctx.spec.endpoint)?;
    Ok((sub, Some(monitor)))
}

/// Registers a socket's `ZMQ_FD` (edge-triggered) with the thread's `epoll`.
pub(super) fn register(registry: &Registry, s: &Socket, token: Token) -> Result<(), zmq::Error> {
    let fd = s.get_fd()?;
    registry.register(&mut SourceFd(&fd), token, Interest::READABLE).map_err(io_error)
}

/// An `epoll` error as the stream's failure (EIO, 5, when the OS gave no number).
fn io_error(e: std::io::Error) -> zmq::Error {
    zmq::Error::from_raw(e.raw_os_error().unwrap_or(5))
}

impl Worker {
    /// A replay from `start_seq`, once the stream holds a replay slot.
    pub(super) fn request_snapshot(&mut self, start_seq: u64) -> Result<(), zmq::Error> {
        self.dealer_retry = None;
        match self.replay.want(start_seq) {
            Some(seq) => self.open_dealer(seq),
            None => Ok(()), // queued: `granted` brings the slot
        }
    }

    /// Opens the DEALER for a replay from `start_seq`; with no file descriptor left, gives the
    /// replay slot back and tries again after a back-off (the replay's timeout still runs).
    pub(super) fn open_dealer(&mut self, start_seq: u64) -> Result<(), zmq::Error> {
        match self.try_open_dealer(start_seq) {
            Err(e) if is_out_of_fds(e) => {
                self.close_dealer();
                let spec = &self.ctx.spec;
                self.replay.starved(&spec.instance_name, spec.dp_rank, e);
                let at = Instant::now() + self.fd_backoff.next_delay();
                self.dealer_retry = Some((start_seq, at));
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) => {
                self.fd_backoff.reset();
                Ok(())
            }
        }
    }

    /// A fresh DEALER per request: an old one may still hold stale replies.
    fn try_open_dealer(&mut self, start_seq: u64) -> Result<(), zmq::Error> {
        let spec = &self.ctx.spec;
        faults::check(FaultPoint::SnapshotRequest, &spec.instance_name, spec.dp_rank)?;
        self.close_dealer();
        let dealer = self.ctx.zmq.socket(zmq::DEALER)?;
        dealer.set_linger(0)?;
        dealer.set_maxmsgsize(max_frame(&self.ctx.limits))?;
        dealer.connect(&self.ctx.spec.replay_endpoint)?;
        dealer.send_multipart([&b""[..], &start_seq.to_be_bytes()[..]], zmq::DONTWAIT).or_else(
            |e| {
                // No peer yet: the request is lost and the replay timeout retries it.
                if e == zmq::Error::EAGAIN {
                    Ok(())
                } else {
                    Err(e)
                }
            },
        )?;
        register(&self.registry, &dealer, self.token)?;
        self.dealer = Some(dealer);
        self.requests += 1;
        Ok(())
    }

    /// Closes the DEALER, taken out of `epoll` first (its descriptor may be reused at once).
    pub(super) fn close_dealer(&mut self) {
        if let Some(d) = self.dealer.take() {
            if let Ok(fd) = d.get_fd() {
                let _ = self.registry.deregister(&mut SourceFd(&fd));
            }
        }
    }
}
