//! [`Conn`]: a stream's TCP connection to its publisher (a SUB's, live) or to its replay
//! endpoint (a DEALER's, one request), read by the stream's I/O thread itself. It connects
//! (again after a loss, with libzmq's back-off: 100 ms doubling to 2 s), greets, sends READY
//! and, once the peer's READY names a socket type it talks to, its first message (the
//! subscription, or the request), then reads messages in place from a buffer; a PING is
//! answered. A DEALER whose request went out is not reconnected (libzmq sent a request once
//! too): its replay times out and asks again on a fresh connection, so no reply is read twice. TCP keepalive and
//! `TCP_USER_TIMEOUT` give a vanished host up after `publisher_timeout_ms`, as the SUB
//! socket's options did, and a connect or handshake that hangs that long (30 s at most, 30 s
//! when 0) is given up and retried. A connection an engine made to the bind endpoint
//! (accepted, `open.rs`) is a SUB's that subscribes to every topic and is never reconnected.
//!
//! Reading: the socket is in the thread's `epoll` (edge-triggered, read and write); a turn
//! reads until a read comes back short (the kernel's queue is then empty, and new bytes fire
//! the edge again) and parses whole messages out of the buffer. An idle connection holds no
//! buffer: a turn borrows the thread's spare and gives it back unless a partial message
//! remains (a small one is copied out).

use std::cell::Cell;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use kvdir::backoff::Backoff;
use mio::net::TcpStream;
use mio::{Registry, Token};

use super::codec::{self, Item, Role, ZmtpError, GREETING_LEN};

/// libzmq's default handshake timeout (`ZMQ_HANDSHAKE_IVL`), and the longest connect.
pub(super) const HANDSHAKE: Duration = Duration::from_secs(30);
/// The thread's spare buffer: its size, and the most it keeps.
const READ_CHUNK: usize = 64 * 1024;
const MAX_SPARE: usize = 1 << 20;
/// A partial message up to this size is copied out so the spare goes back to the thread.
const SMALL_PARTIAL: usize = 4096;

thread_local! {
    /// The calling I/O thread's spare read buffer.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// What [`Conn::next`] brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The handshake completed and the subscription is sent.
    Connected,
    /// A connection that had completed its handshake is lost: why.
    Disconnected(String),
    /// A message: [`Conn::with_message`] shows its frames.
    Message,
    /// Nothing more now: the socket is drained, or a reconnect is not due yet.
    Idle,
}

pub(super) enum State {
    /// Not connected: connects at `at`.
    Waiting { at: Instant },
    /// Connecting (until the greeting could be written) or greeting, until `deadline`.
    Handshake { stream: TcpStream, deadline: Instant, tcp_up: bool, greeted: bool },
    /// Subscribed (or requested): messages flow.
    Ready { stream: TcpStream },
    /// A DEALER's connection ended after its request: nothing more comes.
    Closed,
}

/// A live stream's connection to its publisher.
pub struct Conn {
    pub(super) addr: SocketAddr,
    pub(super) role: Role,
    /// What is sent once the peer is ready (the subscription or the request).
    pub(super) hello: Vec<u8>,
    pub(super) max_frame: u64,
    pub(super) timeout: Duration,
    pub(super) state: State,
    pub(super) backoff: Backoff,
    /// Received bytes; `buf[start..end]` is not parsed yet.
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Bytes the last message took (consumed at the next step).
    pub(super) taken: usize,
    /// The last message's frames, ranges of `buf[start..]`.
    pub(super) frames: Vec<Range<usize>>,
    /// Bytes to send.
    pub(super) out: Vec<u8>,
    /// The socket was read empty this turn.
    pub(super) drained: bool,
    /// The turn has not reached the end of the input yet.
    pub(super) busy: bool,
    /// Whether a failed attempt was logged since the last handshake.
    pub(super) warned: bool,
    /// The peer connected to kvdir (the bind endpoint): never reconnected.
    pub(super) accepted: bool,
}

impl Conn {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the connection is over for good (an accepted one lost or refused, or a
    /// DEALER's after its request).
    pub fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// When the connection has something to do without input (a reconnect, a timeout).
    pub fn deadline(&self) -> Option<Instant> {
        match &self.state {
            State::Waiting { at } => Some(*at),
            State::Handshake { deadline, .. } => Some(*deadline),
            State::Ready { .. } | State::Closed => None,
        }
    }

    /// Starts a turn: the socket is read again.
    pub fn begin_turn(&mut self) {
        (self.drained, self.busy) = (false, true);
    }

    /// Whether input may be left after the turn (it stopped before [`Step::Idle`]).
    pub fn readable(&self) -> bool {
        self.busy
    }

    /// The next step: connects when due, greets, reads and parses.
    pub fn next(&mut self, now: Instant, registry: &Registry, token: Token) -> Step {
        self.start += std::mem::take(&mut self.taken);
        let step = match self.step(now, registry, token) {
            Ok(step) => step,
            Err(reason) => self.close(now, registry, reason),
        };
        if step == Step::Idle {
            self.busy = false;
        }
        step
    }

    /// Calls `f` with the frames of the message [`Conn::next`] just returned.
    pub fn with_message<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let base = &self.buf[self.start..];
        if let [a, b, c] = &self.frames[..] {
            f(&[&base[a.clone()], &base[b.clone()], &base[c.clone()]])
        } else {
            f(&self.frames.iter().map(|r| &base[r.clone()]).collect::<Vec<_>>())
        }
    }

    /// Ends a turn: an empty buffer goes back to the thread (a small partial message is
    /// copied out first).
    pub fn end_turn(&mut self) {
        self.start += std::mem::take(&mut self.taken);
        let pending = self.end - self.start;
        if self.buf.is_empty() || pending > SMALL_PARTIAL {
            return;
        }
        let kept = self.buf[self.start..self.end].to_vec();
        let spare = std::mem::replace(&mut self.buf, kept);
        (self.start, self.end) = (0, pending);
        if spare.len() <= MAX_SPARE {
            SPARE.set(spare);
        }
    }

    fn step(&mut self, now: Instant, registry: &Registry, token: Token) -> Result<Step, String> {
        loop {
            match &mut self.state {
                State::Closed => return Ok(Step::Idle),
                State::Waiting { at } if now < *at => return Ok(Step::Idle),
                State::Waiting { .. } => {
                    let addr = self.addr;
                    self.connect(now, registry, token)
                        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
                }
                State::Handshake { deadline, .. } if now >= *deadline => {
                    return Err(format!("no ZMTP handshake with {} in time", self.addr));
                }
                State::Handshake { .. } => match self.handshake(now)? {
                    Some(step) => return Ok(step),
                    None => {
                        if !self.read_more()? {
                            return Ok(Step::Idle);
                        }
                    }
                },
                State::Ready { .. } => {
                    self.flush()?;
                    match self.parse()? {
                        Some(step) => return Ok(step),
                        None if !self.read_more()? => return Ok(Step::Idle),
                        None => {}
                    }
                }
            }
        }
    }

    /// Advances the handshake with what is buffered: `Some(Connected)` once done.
    fn handshake(&mut self, now: Instant) -> Result<Option<Step>, String> {
        let written = self.flush()?;
        let State::Handshake { deadline, tcp_up, greeted, .. } = &mut self.state else {
            return Ok(None);
        };
        if written && !*tcp_up {
            // TCP is up: the handshake's own timeout starts.
            (*tcp_up, *deadline) = (true, now + HANDSHAKE);
        }
        let pending = &self.buf[self.start..self.end];
        if !*greeted {
            if pending.len() < GREETING_LEN {
                // A peer that is no ZMTP 3 socket is refused at its first bytes, as libzmq does.
                codec::check_signature(pending).map_err(|e| e.to_string())?;
                return Ok(None);
            }
            codec::check_greeting(pending).map_err(|e| e.to_string())?;
            *greeted = true;
            self.start += GREETING_LEN;
        }
        let pending = &self.buf[self.start..self.end];
        match codec::next_item(pending, self.max_frame, &mut self.frames) {
            Ok(Item::Partial) => Ok(None),
            Ok(Item::Command { len, name, data }) => {
                let (name, data) = (&pending[name], &pending[data]);
                let ready = name == b"READY";
                if ready {
                    codec::check_ready(self.role, data).map_err(|e| e.to_string())?;
                } else if name == b"ERROR" {
                    return Err(peer_error(data));
                }
                self.start += len;
                if !ready {
                    return Ok(None);
                }
                self.out.extend_from_slice(&self.hello);
                let State::Handshake { stream, .. } =
                    std::mem::replace(&mut self.state, State::Waiting { at: now })
                else {
                    unreachable!("checked above")
                };
                self.state = State::Ready { stream };
                self.flush()?;
                (self.warned, self.drained) = (false, false);
                self.backoff.reset();
                Ok(Some(Step::Connected))
            }
            Ok(Item::Message { .. }) => Err("a message before the publisher's READY".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Parses the next message or command: `Some(Message)`, or `None` when more bytes are
    /// needed (commands are handled here).
    fn parse(&mut self) -> Result<Option<Step>, String> {
        loop {
            let pending = &self.buf[self.start..self.end];
            match codec::next_item(pending, self.max_frame, &mut self.frames) {
                Ok(Item::Partial) => return Ok(None),
                Ok(Item::Message { len }) => {
                    self.taken = len;
                    return Ok(Some(Step::Message));
                }
                Ok(Item::Command { len, name, data }) => {
                    match &pending[name] {
                        b"PING" => codec::pong(&pending[data], &mut self.out),
                        b"ERROR" => return Err(peer_error(&pending[data])),
                        _ => {}
                    }
                    self.start += len;
                    self.flush()?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Reads what the socket holds into the buffer: `false` when nothing more comes now.
    fn read_more(&mut self) -> Result<bool, String> {
        if self.drained {
            return Ok(false);
        }
        let stream = match &mut self.state {
            State::Handshake { stream, .. } | State::Ready { stream } => stream,
            State::Waiting { .. } | State::Closed => return Ok(false),
        };
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if self.buf.is_empty() {
            self.buf = SPARE.take();
            self.buf.resize(self.buf.len().max(READ_CHUNK), 0);
        } else if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            } else {
                self.buf.resize(self.buf.len().max(READ_CHUNK) * 2, 0);
            }
        }
        let room = self.buf.len() - self.end;
        loop {
            match stream.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(format!("{} closed the connection", self.addr)),
                Ok(n) => {
                    self.end += n;
                    // A short read emptied the kernel's queue: new bytes fire the edge again.
                    self.drained = n < room;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.drained = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading from {}: {e}", self.addr)),
            }
        }
    }

    /// Writes what is queued: `true` once all of it is written (`false`: the socket is not
    /// writable yet, e.g. still connecting).
    fn flush(&mut self) -> Result<bool, String> {
        let stream = match &mut self.state {
            State::Handshake { stream, .. } | State::Ready { stream } => stream,
            State::Waiting { .. } | State::Closed => return Ok(false),
        };
        while !self.out.is_empty() {
            match stream.write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(false),
                Err(e) => return Err(format!("cannot reach {}: {e}", self.addr)),
            }
        }
        Ok(true)
    }

    /// Drops the connection (to reconnect after the back-off, unless a DEALER's request
    /// went out).
    fn close(&mut self, now: Instant, registry: &Registry, reason: String) -> Step {
        let at = now + self.backoff.next_delay();
        let next = match (self.role, &self.state) {
            _ if self.accepted => State::Closed,
            (Role::Dealer, State::Ready { .. } | State::Closed) => State::Closed,
            _ => State::Waiting { at },
        };
        let old = std::mem::replace(&mut self.state, next);
        (self.start, self.end, self.taken) = (0, 0, 0);
        let spare = std::mem::take(&mut self.buf);
        if !spare.is_empty() && spare.len() <= MAX_SPARE {
            SPARE.set(spare);
        }
        self.out.clear();
        match old {
            State::Ready { mut stream } => {
                let _ = registry.deregister(&mut stream);
                Step::Disconnected(reason)
            }
            State::Handshake { mut stream, .. } => {
                let _ = registry.deregister(&mut stream);
                self.log_failure(&reason);
                Step::Idle
            }
            State::Waiting { .. } => {
                self.log_failure(&reason);
                Step::Idle
            }
            State::Closed => Step::Idle,
        }
    }

    /// Closes the connection for good, out of `epoll` first.
    pub fn shut(&mut self, registry: &Registry) {
        if let State::Handshake { stream, .. } | State::Ready { stream } = &mut self.state {
            let _ = registry.deregister(stream);
        }
        self.state = State::Closed;
    }

    /// A failed connect or handshake: a SUB's logged once until one succeeds (a publisher not
    /// up yet is routine), a DEALER's at DEBUG (its replay's timeout reports it).
    fn log_failure(&mut self, reason: &str) {
        if self.accepted {
            tracing::debug!(peer = %self.addr, reason, "a connection to kv_events_bind is refused");
        } else if self.role == Role::Sub && !std::mem::replace(&mut self.warned, true) {
            tracing::info!(endpoint = %self.addr, reason, "cannot connect to the publisher yet; retrying");
        } else {
            tracing::debug!(endpoint = %self.addr, reason, "connect retry failed");
        }
    }
}

/// An ERROR command's data (a length byte, the reason) as the connection's failure.
fn peer_error(data: &[u8]) -> String {
    let reason = String::from_utf8_lossy(data.get(1..).unwrap_or_default());
    ZmtpError::PeerError(reason.into_owned()).to_string()
}
