//! Opening a [`Conn`]: a SUB's to a publisher and a DEALER's to a replay endpoint (kvdir
//! connects), a SUB's side of a connection a publisher made to a port kvdir listens on (the
//! bind endpoint), and their TCP keepalive and `TCP_USER_TIMEOUT`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvdir::backoff::Backoff;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustix::net::sockopt;

use super::codec::{self, Role};
use super::conn::{Conn, State, HANDSHAKE};
use crate::stream::worker::{keepalive, RECONNECT_MAX, RECONNECT_MIN};

/// The address of a `tcp://IP:PORT` endpoint; `None` for names and other transports.
pub fn endpoint_addr(endpoint: &str) -> Option<SocketAddr> {
    endpoint.strip_prefix("tcp://")?.parse().ok()
}

impl Conn {
    /// A SUB's connection to `addr` subscribing to `topic`, connecting at the first step.
    pub fn sub(addr: SocketAddr, topic: &[u8], max_frame: u64, timeout: Duration) -> Conn {
        let mut hello = Vec::new();
        codec::subscribe(topic, &mut hello);
        Conn::new(addr, Role::Sub, hello, max_frame, timeout)
    }

    /// A DEALER's connection to `addr` sending one message of `request`, connecting now
    /// (an error is the socket's: e.g. no descriptor left).
    pub fn dealer(
        addr: SocketAddr,
        request: &[&[u8]],
        max_frame: u64,
        timeout: Duration,
        (registry, token): (&Registry, Token),
    ) -> std::io::Result<Conn> {
        let mut hello = Vec::new();
        codec::message(request, &mut hello);
        let mut conn = Conn::new(addr, Role::Dealer, hello, max_frame, timeout);
        conn.connect(Instant::now(), registry, token)?;
        Ok(conn)
    }

    /// A SUB's side of a connection a publisher made to a port kvdir listens on (the bind
    /// endpoint), registered with `registry` now: it greets at once and subscribes to every
    /// topic (the port routes by topic); once lost or refused it stays closed.
    pub fn accepted(
        stream: TcpStream,
        addr: SocketAddr,
        max_frame: u64,
        timeout: Duration,
        (registry, token): (&Registry, Token),
    ) -> std::io::Result<Conn> {
        let mut hello = Vec::new();
        codec::subscribe(b"", &mut hello);
        let mut conn = Conn::new(addr, Role::Sub, hello, max_frame, timeout);
        conn.accepted = true;
        let deadline = Instant::now() + HANDSHAKE;
        conn.begin_handshake(stream, (registry, token), deadline, true)?;
        Ok(conn)
    }
    fn new(
        addr: SocketAddr,
        role: Role,
        hello: Vec<u8>,
        max_frame: u64,
        timeout: Duration,
    ) -> Conn {
        Conn {
            addr,
            role,
            hello,
            max_frame,
            timeout,
            state: State::Waiting { at: Instant::now() },
            backoff: Backoff::new(RECONNECT_MIN, RECONNECT_MAX),
            buf: Vec::new(),
            start: 0,
            end: 0,
            taken: 0,
            frames: Vec::new(),
            out: Vec::new(),
            drained: false,
            busy: false,
            warned: false,
            accepted: false,
        }
    }
    pub(super) fn connect(
        &mut self,
        now: Instant,
        registry: &Registry,
        token: Token,
    ) -> std::io::Result<()> {
        let stream = TcpStream::connect(self.addr)?;
        let wait = if self.timeout.is_zero() { HANDSHAKE } else { self.timeout.min(HANDSHAKE) };
        self.begin_handshake(stream, (registry, token), now + wait, false)
    }

    /// Watches `stream` (TCP up already when `tcp_up`: an accepted connection) and queues
    /// this side's greeting and READY; the handshake must end by `deadline`.
    fn begin_handshake(
        &mut self,
        mut stream: TcpStream,
        (registry, token): (&Registry, Token),
        deadline: Instant,
        tcp_up: bool,
    ) -> std::io::Result<()> {
        set_liveness(&stream, self.timeout)?;
        registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
        self.out.clear();
        self.out.extend_from_slice(&codec::greeting());
        codec::ready(self.role, &mut self.out);
        self.state = State::Handshake { stream, deadline, tcp_up, greeted: false };
        Ok(())
    }
}

/// TCP keepalive and `TCP_USER_TIMEOUT` for a publisher timeout (none when it is 0).
pub(super) fn set_liveness(s: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    let Some((idle, interval)) = keepalive(timeout) else { return Ok(()) };
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    sockopt::set_tcp_user_timeout(s, ms)?;
    sockopt::set_socket_keepalive(s, true)?;
    sockopt::set_tcp_keepidle(s, Duration::from_secs(u64::from(idle)))?;
    sockopt::set_tcp_keepintvl(s, Duration::from_secs(u64::from(interval)))?;
    sockopt::set_tcp_keepcnt(s, crate::stream::worker::KEEPALIVE_PROBES)?;
    Ok(())
}
