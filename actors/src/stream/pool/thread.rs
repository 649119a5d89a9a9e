//! One I/O thread: waits in `epoll` (through `mio`) on the `ZMQ_FD` of its streams' sockets,
//! its waker and its earliest recovery deadline, then serves only the streams that need it.
//!
//! libzmq's `ZMQ_FD` is edge-triggered and only says that `ZMQ_EVENTS` may have changed, so a
//! stream whose fd fired joins the thread's ready list, and after serving it (every receive and
//! send of that turn done) the worker reads `ZMQ_EVENTS` of its sockets: while one is readable
//! the stream stays in the list. A turn serves each ready stream once, with a bounded burst
//! (`MAX_BURST` messages per socket), so a busy or replaying stream cannot starve the others;
//! the thread sleeps only once the list is empty. The work per wake-up is proportional to the
//! streams that are ready or due, never to all of the thread's streams.
//!
//! A stream whose sockets cannot open for want of a file descriptor waits in `starved` with a
//! timer and tries again (`fds.rs`); it stays pinned to the thread meanwhile. The bind
//! endpoint's ports this thread owns are read before each turn (`ports.rs`).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvdir::backoff::Backoff;
use kvdir::stream::StreamPhase;
use mio::Token;

use super::fds::{fd_backoff, is_out_of_fds};
use super::ports::{self, Ports, Reach};
use super::replays::{ReplaySlot, Waiter};
use super::timers::Timers;
use super::{Command, Exited, NewStream, PoolShared, ThreadRef};
use crate::faults;
use crate::stream::sockets::describe;
use crate::stream::worker::{token_stream, Worker};
use crate::sync::lock;

/// The token of a thread's waker (stream tokens are stream ids).
pub(super) const WAKER: Token = Token(usize::MAX);
/// What a panic while serving a stream is reported as.
const PANICKED: &str = "the stream thread panicked";
/// How often a stream held by fault injection is looked at again.
const HELD_RETRY: Duration = Duration::from_millis(5);
/// The least time between two wake-ups of a thread that sleeps (see [`PoolThread::run`]).
pub(super) const WAKE_INTERVAL: Duration = Duration::from_millis(4);

/// A stream served by this thread.
struct Entry {
    worker: Worker,
    exited: Exited,
    /// Whether it is in the ready list.
    queued: bool,
    /// Its entry in the timers, if any (other entries for it are stale).
    timer: Option<Instant>,
}

/// A stream waiting for a file descriptor to open its sockets.
struct Starved {
    stream: NewStream,
    backoff: Backoff,
    /// When it tries again (its entry in the timers).
    at: Instant,
}

/// An I/O thread's state.
pub(super) struct PoolThread {
    index: usize,
    poll: mio::Poll,
    registry: Arc<mio::Registry>,
    shared: Arc<PoolShared>,
    streams: HashMap<u64, Entry>,
    starved: HashMap<u64, Starved>,
    /// The bind endpoint's ports this thread reads, and its bound streams by key.
    ports: Ports,
    ready: VecDeque<u64>,
    timers: Timers,
}

impl PoolThread {
    /// Thread `index` of the pool, waiting on `poll`.
    pub(super) fn new(
        index: usize,
        poll: mio::Poll,
        shared: Arc<PoolShared>,
    ) -> std::io::Result<PoolThread> {
        let registry = Arc::new(poll.registry().try_clone()?);
        let (streams, starved) = (HashMap::new(), HashMap::new());
        let (ready, timers) = (VecDeque::new(), Timers::default());
        let ports = Ports::default();
        Ok(PoolThread { index, poll, registry, shared, streams, starved, ports, ready, timers })
    }

    fn me(&self) -> &ThreadRef {
        &self.shared.threads[self.index]
    }

    /// Serves streams until told to end; then closes every stream's sockets.
    ///
    /// A thread about to sleep less than [`WAKE_INTERVAL`] after it last woke up first sleeps
    /// out the rest of the interval, then takes everything that came meanwhile in one wake-up:
    /// a fleet's messages arrive one at a time, and waking for each cost more than serving it
    /// (a context switch on each side, ~0.6 a batch). A message waits at most that long; a
    /// thread woken less often than that (an idle fleet) never waits.
    pub(super) fn run(mut self) {
        let mut events = mio::Events::with_capacity(1024);
        let mut woke = Instant::now();
        loop {
            let timeout = if self.ready.is_empty() && !self.ports.any_queued() {
                let early = WAKE_INTERVAL.saturating_sub(woke.elapsed());
                if !early.is_zero() {
                    std::thread::sleep(early);
                }
                self.timers.next().map(|at| at.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(thread = %self.me().name, error = %e, "epoll failed");
                }
                continue;
            }
            if timeout != Some(Duration::ZERO) {
                woke = Instant::now();
            }
            let mut commands = false;
            for ev in events.iter() {
                match ev.token() {
                    WAKER => commands = true,
                    t => match (ports::port_of(t), ports::conn_of(t)) {
                        (Some(i), _) => self.ports.ports[i].queued = true,
                        (None, Some(c)) => self.ports.conn_fired(c),
                        (None, None) => self.stream_fired(t),
                    },
                }
            }
            if commands && !self.commands() {
                break;
            }
            self.due_timers(Instant::now());
            self.read_ports();
            self.turn();
        }
        let (n, starved) = (self.streams.len(), self.starved.len());
        self.streams.clear();
        self.starved.clear();
        self.shared.fds.wait_ended(starved);
        self.me().streams.fetch_sub(n + starved, Ordering::Relaxed);
    }

    /// Runs the posted commands; `false` once told to end.
    fn commands(&mut self) -> bool {
        let posted = std::mem::take(&mut *lock(&self.me().commands));
        for c in posted {
            match c {
                Command::Add(id, stream) => self.add(id, *stream, None),
                Command::Remove(id) => {
                    if self.starved.remove(&id).is_some() {
                        self.shared.fds.wait_ended(1);
                        self.me().streams.fetch_sub(1, Ordering::Relaxed);
                    } else if let Some(e) = self.streams.remove(&id) {
                        self.unbind(id, &e.worker);
                        self.me().streams.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Command::Port(rank, socket, routes) => {
                    self.ports.attach(&self.registry, rank, *socket, routes);
                }
                Command::Granted(id) => match self.streams.get_mut(&id) {
                    Some(e) => {
                        e.worker.granted();
                        self.mark_ready(id);
                    }
                    // The stream left meanwhile: the slot goes to the next waiter.
                    None => self.shared.release(),
                },
                Command::End => return false,
            }
        }
        true
    }

    /// Opens a stream's sockets; `backoff` is its wait so far when it was short of descriptors.
    fn add(&mut self, id: u64, stream: NewStream, backoff: Option<Backoff>) {
        let NewStream { ctx, exited } = stream;
        let me = Waiter { thread: self.index, stream: id };
        let slot = ReplaySlot::new(Arc::clone(&self.shared), me);
        let registry = Arc::clone(&self.registry);
        let opening = ctx.clone();
        let opened = catch_unwind(AssertUnwindSafe(|| Worker::open(opening, id, registry, slot)));
        let worker = match opened {
            Ok(Ok(w)) => w,
            Ok(Err(e)) if is_out_of_fds(e) => {
                return self.starve(id, NewStream { ctx, exited }, backoff, e);
            }
            Ok(Err(e)) => return self.failed(exited, describe(e)),
            Err(_) => return self.failed(exited, PANICKED.to_string()),
        };
        if backoff.is_some() {
            self.shared.fds.wait_ended(1);
        }
        if let Some(key) = worker.bound_key() {
            self.ports.bind_stream(key, id);
        }
        self.streams.insert(id, Entry { worker, exited, queued: false, timer: None });
        self.mark_ready(id);
    }

    /// No descriptor for the stream's sockets (`e`): it waits and tries again, without credit.
    fn starve(&mut self, id: u64, stream: NewStream, backoff: Option<Backoff>, e: zmq::Error) {
        if backoff.is_none() {
            self.shared.fds.wait_started();
        }
        let mut backoff = backoff.unwrap_or_else(fd_backoff);
        let spec = &stream.ctx.spec;
        self.shared.fds.starved(&spec.instance_name, spec.dp_rank, "sockets", e);
        {
            let mut status = lock(&stream.ctx.status);
            status.phase = StreamPhase::Backoff;
            status.connected = false;
            status.last_fault = Some(format!("cannot open the stream's sockets: {}", describe(e)));
        }
        let at = Instant::now() + backoff.next_delay();
        self.timers.push(at, id);
        self.starved.insert(id, Starved { stream, backoff, at });
    }

    /// A bound stream leaves this thread: its port's messages no longer reach it.
    fn unbind(&mut self, id: u64, worker: &Worker) {
        if let Some(key) = worker.bound_key() {
            self.ports.unbind_stream(key, id);
        }
    }

    /// Reads every port and connection due a read; each message is handed to its stream,
    /// which decodes and applies it at once and gets a turn (to publish).
    fn read_ports(&mut self) {
        let mut failed: Vec<(u64, String)> = Vec::new();
        let (streams, ready) = (&mut self.streams, &mut self.ready);
        let reach =
            Reach { registry: &self.registry, timers: &mut self.timers, fds: &self.shared.fds };
        self.ports.serve(reach, |id, parts| {
            let Some(e) = streams.get_mut(&id) else { return };
            if failed.iter().any(|(f, _)| *f == id) {
                return;
            }
            match catch_unwind(AssertUnwindSafe(|| e.worker.deliver(parts))) {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    e.worker.publish_status();
                    failed.push((id, describe(err)));
                }
                Err(_) => failed.push((id, PANICKED.to_string())),
            }
            if !e.queued {
                e.queued = true;
                ready.push_back(id);
            }
        });
        for (id, reason) in failed {
            self.fail(id, reason);
        }
    }

    /// A stream failed (it is no longer in the map): its actor restarts it.
    fn failed(&self, exited: Exited, reason: String) {
        self.me().streams.fetch_sub(1, Ordering::Relaxed);
        exited(reason);
    }

    /// A stream's socket (or its monitor) fired: the stream gets a turn.
    fn stream_fired(&mut self, t: Token) {
        let (id, monitor) = token_stream(t);
        if monitor {
            if let Some(e) = self.streams.get_mut(&id) {
                e.worker.monitor_fired();
            }
        }
        self.mark_ready(id);
    }

    fn mark_ready(&mut self, id: u64) {
        if let Some(e) = self.streams.get_mut(&id) {
            if !e.queued {
                e.queued = true;
                self.ready.push_back(id);
            }
        }
    }

    fn due_timers(&mut self, now: Instant) {
        while let Some((at, id)) = self.timers.pop_due(now) {
            if ports::is_port_timer(id) {
                self.ports.timer_due(id, at);
            } else if let Some(e) = self.streams.get_mut(&id).filter(|e| e.timer == Some(at)) {
                e.timer = None;
                self.mark_ready(id);
            } else if self.starved.get(&id).is_some_and(|s| s.at == at) {
                if let Some(s) = self.starved.remove(&id) {
                    self.add(id, s.stream, Some(s.backoff));
                }
            }
        }
        if self.timers.len() > 4 * (self.streams.len() + self.starved.len()) + 64 {
            let (streams, starved, ports) = (&self.streams, &self.starved, &self.ports);
            self.timers.retain(|at, id| {
                (ports::is_port_timer(id) && ports.timer_wanted(id, at))
                    || streams.get(&id).is_some_and(|e| e.timer == Some(at))
                    || starved.get(&id).is_some_and(|s| s.at == at)
            });
        }
    }

    /// Serves each stream ready at the start of the turn once.
    fn turn(&mut self) {
        for _ in 0..self.ready.len() {
            let Some(id) = self.ready.pop_front() else { break };
            let Some(e) = self.streams.get_mut(&id) else { continue };
            e.queued = false;
            let spec = e.worker.spec();
            if faults::stream_held(&spec.instance_name, spec.dp_rank) {
                // Injected stall (tests): this stream waits, the thread's others do not.
                let at = Instant::now() + HELD_RETRY;
                e.timer = Some(at);
                self.timers.push(at, id);
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| e.worker.handle())) {
                Ok(Ok(_)) if e.worker.ended() => {
                    // The writer is gone: the stream is being stopped.
                    if let Some(e) = self.streams.remove(&id) {
                        self.unbind(id, &e.worker);
                    }
                    self.me().streams.fetch_sub(1, Ordering::Relaxed);
                }
                Ok(Ok(more)) => {
                    if more {
                        self.mark_ready(id);
                    }
                    self.schedule(id);
                }
                Ok(Err(err)) => {
                    e.worker.publish_status();
                    self.fail(id, describe(err));
                }
                Err(_) => self.fail(id, PANICKED.to_string()),
            }
        }
    }

    fn fail(&mut self, id: u64, reason: String) {
        if let Some(e) = self.streams.remove(&id) {
            self.unbind(id, &e.worker);
            drop(e.worker);
            self.failed(e.exited, reason);
        }
    }

    /// Keeps the stream's recovery deadline in the timers (at least 1 ms ahead, so a deadline
    /// that `on_tick` just missed is looked at again, not spun on).
    fn schedule(&mut self, id: u64) {
        let Some(e) = self.streams.get_mut(&id) else { return };
        let soonest = Instant::now() + Duration::from_millis(1);
        let key = e.worker.next_deadline().map(|at| at.max(soonest));
        if key != e.timer {
            e.timer = key;
            if let Some(at) = key {
                self.timers.push(at, id);
            }
        }
    }
}
