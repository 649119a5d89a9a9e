//! Opening a worker's sockets: the SUB socket and its monitor, the fresh DEALER of each replay
//! request (once the stream holds a replay slot), and their `ZMQ_FD`s in the thread's `epoll`.
//! A DEALER that cannot open for want of a file descriptor is tried again after a back-off.

use std::net::SocketAddr;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::io::Errno as E;

use super::{Socket, Worker, WorkerCtx, MAX_BURST, SUB_HWM};
use crate::faults::{self, FaultPoint};
use crate::stream::pool::is_out_of_fds;
use crate::stream::sockets::max_frame;
use crate::stream::zmtp::{endpoint_addr, Conn, Step};

/// The reconnect back-off of a connection to a publisher, libzmq's SUB socket's and kvdir's
/// own reader's alike: 100 ms, doubling to 2 s.
pub(crate) const RECONNECT_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// See [`RECONNECT_MIN`].
pub(crate) const RECONNECT_MAX: std::time::Duration = std::time::Duration::from_millis(2000);

/// Unanswered TCP keepalive probes after which the kernel drops a connection.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// TCP keepalive for a publisher `timeout`: seconds idle before the first probe and between
/// probes, each a quarter of `timeout` (at least 1 s: the kernel counts in seconds), so a host
/// that vanished is given up after `timeout` (at least 4 s); `None` when `timeout` is zero.
pub(crate) fn keepalive(timeout: std::time::Duration) -> Option<(u32, u32)> {
    if timeout.is_zero() {
        return None;
    }
    let quarter = (timeout.as_millis() as f64 / 4000.0).round().clamp(1.0, 65_535.0) as u32;
    Some((quarter, quarter))
}

/// Liveness of a connected publisher: TCP keepalive ([`keepalive`]) on the SUB socket's
/// connections, and the same timeout for data it sent that stays unacknowledged
/// (`TCP_USER_TIMEOUT`), so a host that vanished without closing them is disconnected (the
/// monitor reports it) after about `publisher_timeout_ms`. A dead process closes its
/// connections and is seen at once. The kernel's timers cost kvdir no CPU; ZMTP heartbeats did
/// (design.md). A connect that hangs that long (a SYN into the void) is given up and retried.
fn set_liveness(sub: &mut Socket, timeout: std::time::Duration) -> Result<(), zmq::Error> {
    let Some((idle, interval)) = keepalive(timeout) else { return Ok(()) };
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    sub.set_tcp_maxrt(timeout_ms)?;
    sub.set_tcp_keepalive(1)?;
    sub.set_tcp_keepalive_idle(idle as i32)?;
    sub.set_tcp_keepalive_intvl(interval as i32)?;
    sub.set_tcp_keepalive_cnt(KEEPALIVE_PROBES as i32)?;
    sub.set_connect_timeout(timeout_ms)
}

/// The SUB socket, subscribed and connecting, and the monitor that reports its handshakes
/// and disconnects; an in-process SUB (the bind endpoint's fan-out) has neither handshakes nor
/// disconnects, so no monitor (two descriptors fewer a stream).
pub(super) fn open_sub(ctx: &WorkerCtx, id: u64) -> Result<(Socket, Option<Socket>), zmq::Error> {
    let mut sub = ctx.zmq.socket(zmq::SUB)?;
    sub.set_linger(0)?;
    sub.set_rcvhwm(SUB_HWM)?;
    sub.set_maxmsgsize(max_frame(&ctx.limits))?;
    if ctx.spec.endpoint.starts_with("inproc://") {
        sub.set_subscribe(ctx.spec.topic.as_bytes())?;
        sub.connect(&ctx.spec.endpoint)?;
        return Ok((sub, None));
    }
    sub.set_reconnect_ivl(RECONNECT_MIN.as_millis() as i32)?;
    sub.set_reconnect_ivl_max(RECONNECT_MAX.as_millis() as i32)?;
    set_liveness(&mut sub, ctx.limits.publisher_timeout)?;
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

    /// A fresh DEALER per request: an old one may still hold stale replies. At an IP address
    /// it is kvdir's own ZMTP connection.
    fn try_open_dealer(&mut self, start_seq: u64) -> Result<(), zmq::Error> {
        let spec = &self.ctx.spec;
        faults::check(FaultPoint::SnapshotRequest, &spec.instance_name, spec.dp_rank)?;
        self.close_dealer();
        if let Some(addr) = endpoint_addr(&self.ctx.spec.replay_endpoint) {
            return self.connect_dealer(addr, start_seq);
        }
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
        self.dealer = Some(Dealer::Zmq(dealer));
        self.requests += 1;
        Ok(())
    }

    /// A DEALER of kvdir's own to `addr`: its request goes out once the handshake is done.
    fn connect_dealer(&mut self, addr: SocketAddr, start_seq: u64) -> Result<(), zmq::Error> {
        let request = [&b""[..], &start_seq.to_be_bytes()[..]];
        let (max, timeout) =
            (max_frame(&self.ctx.limits) as u64, self.ctx.limits.publisher_timeout);
        match Conn::dealer(addr, &request, max, timeout, (&*self.registry, self.token)) {
            Ok(conn) => self.dealer = Some(Dealer::Zmtp(Box::new(conn))),
            Err(e) if matches!(E::from_io_error(&e), Some(E::MFILE | E::NFILE)) => {
                return Err(zmq::Error::EMFILE);
            }
            // The request is lost: the replay timeout retries it.
            Err(e) => tracing::debug!(%addr, error = %e, "cannot connect to the replay endpoint"),
        }
        self.requests += 1;
        Ok(())
    }

    /// Closes the DEALER, taken out of `epoll` first (its descriptor may be reused at once).
    pub(super) fn close_dealer(&mut self) {
        match self.dealer.take() {
            Some(Dealer::Zmq(d)) => {
                if let Ok(fd) = d.get_fd() {
                    let _ = self.registry.deregister(&mut SourceFd(&fd));
                }
            }
            Some(Dealer::Zmtp(mut conn)) => conn.shut(&self.registry),
            None => {}
        }
    }
}

/// A replay request's socket.
pub(super) enum Dealer {
    /// libzmq's, for an endpoint naming a host.
    Zmq(Socket),
    /// kvdir's own connection, at an IP address.
    Zmtp(Box<Conn>),
}

/// The replies a ZMTP DEALER holds, at most [`MAX_BURST`] (a lost connection gives none: the
/// replay times out and asks again).
pub(super) fn read_replies(
    conn: &mut Conn,
    now: Instant,
    registry: &Registry,
    token: Token,
) -> Vec<Vec<Vec<u8>>> {
    let mut replies = Vec::new();
    conn.begin_turn();
    while replies.len() < MAX_BURST {
        match conn.next(now, registry, token) {
            Step::Idle => break,
            Step::Message => {
                replies.push(conn.with_message(|p| p.iter().map(|f| f.to_vec()).collect()))
            }
            Step::Connected | Step::Disconnected(_) => {}
        }
    }
    conn.end_turn();
    replies
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::keepalive;

    #[test]
    fn keepalive_gives_a_vanished_host_up_after_about_the_publisher_timeout() {
        let ms = Duration::from_millis;
        assert_eq!(keepalive(ms(0)), None, "zero turns liveness off");
        assert_eq!(keepalive(ms(3000)), Some((1, 1)), "the default: 1 s + 3 x 1 s");
        assert_eq!(keepalive(ms(10_000)), Some((3, 3)), "10 s: 3 s + 3 x 3 s");
        assert_eq!(keepalive(ms(600)), Some((1, 1)), "below 4 s: the kernel's 1 s steps");
        assert_eq!(keepalive(ms(600_000)), Some((150, 150)));
    }
}
