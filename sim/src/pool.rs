//! The rank threads: a small fixed set of threads ([`set_rank_threads`], by default the
//! cores) shared by every rank of every [`crate::SimEngine`] in the process, and the ZeroMQ
//! contexts their sockets live in.
//!
//! A rank is pinned to one thread when it starts. The thread owns the rank's [`RankState`]
//! (ZeroMQ sockets are not `Sync`), runs the jobs sent to it in order, and serves replay
//! requests event-driven: every rank's ROUTER is registered, edge-triggered, in the thread's
//! epoll set by its `ZMQ_FD`, and the thread sleeps until a ROUTER or its job waker signals.
//! libzmq's rules for `ZMQ_FD` apply: the fd only says that the socket's state may have
//! changed, and any operation on the socket may consume that signal, so whenever the thread
//! serves a rank it drains the ROUTER and re-checks `ZMQ_EVENTS` until it shows no input. Jobs
//! only use the PUB; a restart's new ROUTER is registered and drained at once. An idle rank
//! costs nothing.
//!
//! Contexts: libzmq's context holds at most 1023 sockets (`ZMQ_MAX_SOCKETS`, which the `zmq`
//! crate cannot raise), so ranks take a context with room for [`RANKS_PER_CONTEXT`] ranks;
//! each context adds libzmq's I/O and reaper threads, 2 threads per 400 ranks.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, warn};

use crate::rank::{Job, RankState};
use crate::SimError;

/// Ranks per ZeroMQ context: 2 sockets each, leaving room under libzmq's 1023 for sockets a
/// restart opens before the reaper has released the old ones.
pub const RANKS_PER_CONTEXT: usize = 400;
/// The token of a thread's job waker (rank keys count up from 0).
const WAKE: Token = Token(usize::MAX);
/// Readiness events taken per `epoll_wait`.
const EVENTS: usize = 1024;

/// Threads requested before the pool starts; 0 = the cores.
static THREADS: AtomicUsize = AtomicUsize::new(0);
static POOL: OnceLock<Pool> = OnceLock::new();

/// Sets how many rank threads the process runs (at least 1). Takes effect only before the
/// first engine starts; returns false when the pool is already running with another size.
pub fn set_rank_threads(threads: usize) -> bool {
    THREADS.store(threads.max(1), Ordering::SeqCst);
    POOL.get().is_none_or(|pool| pool.workers.len() == threads.max(1))
}

/// How many rank threads run (or will run).
pub fn rank_threads() -> usize {
    match POOL.get() {
        Some(pool) => pool.workers.len(),
        None => match THREADS.load(Ordering::SeqCst) {
            0 => thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        },
    }
}

/// What a rank thread is asked to do.
enum Message {
    /// Take the rank under `key`, register its ROUTER, acknowledge.
    Add(usize, Box<RankState>, SyncSender<()>),
    /// Run a job on the rank under `key` (dropped, and its caller told, if the rank is gone).
    Run(usize, Job),
    /// Drop the rank (its sockets close), then acknowledge.
    Remove(usize, SyncSender<()>),
}

/// One rank thread as seen from outside.
struct Worker {
    inbox: Sender<Message>,
    waker: Waker,
    /// Set by the thread before it sleeps in epoll; a sender that clears it wakes the thread.
    /// A burst of jobs then costs one wake-up, not one each.
    asleep: Arc<AtomicBool>,
}

impl Worker {
    /// Queues `message` and wakes the thread if it sleeps; false when the thread is gone.
    fn send(&self, message: Message) -> bool {
        if self.inbox.send(message).is_err() {
            return false;
        }
        !self.asleep.swap(false, Ordering::SeqCst) || self.waker.wake().is_ok()
    }
}

/// The process's rank threads.
struct Pool {
    workers: Vec<Worker>,
    next_key: AtomicUsize,
}

/// Where a rank lives: its thread and its key there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankLink {
    worker: usize,
    key: usize,
}

fn pool() -> Result<&'static Pool, SimError> {
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let started = start_pool(rank_threads())?;
    Ok(POOL.get_or_init(|| started))
}

fn start_pool(threads: usize) -> Result<Pool, SimError> {
    let mut workers = Vec::with_capacity(threads);
    for t in 0..threads {
        let poll = Poll::new().map_err(|source| SimError::Spawn { rank: t as u32, source })?;
        let waker = Waker::new(poll.registry(), WAKE)
            .map_err(|source| SimError::Spawn { rank: t as u32, source })?;
        let (inbox, messages) = mpsc::channel();
        let asleep = Arc::new(AtomicBool::new(false));
        let thread = RankThread { poll, ranks: HashMap::new(), messages, asleep: asleep.clone() };
        thread::Builder::new()
            .name(format!("sim-ranks-{t}"))
            .spawn(move || thread.run())
            .map_err(|source| SimError::Spawn { rank: t as u32, source })?;
        workers.push(Worker { inbox, waker, asleep });
    }
    Ok(Pool { workers, next_key: AtomicUsize::new(0) })
}

/// Hands `state` to a rank thread (round robin) and returns once its ROUTER is watched.
pub(crate) fn add(state: RankState) -> Result<RankLink, SimError> {
    let rank = state.rank();
    let pool = pool()?;
    let key = pool.next_key.fetch_add(1, Ordering::Relaxed);
    let link = RankLink { worker: key % pool.workers.len(), key };
    let (ack, acked) = mpsc::sync_channel(1);
    if !pool.workers[link.worker].send(Message::Add(key, Box::new(state), ack)) {
        return Err(SimError::RankStopped { rank });
    }
    acked.recv().map_err(|_| SimError::RankStopped { rank })?;
    Ok(link)
}

/// Queues `job` for the rank; false when its thread is gone. A job for a removed rank is
/// dropped unrun, which its caller sees as a closed answer channel.
pub(crate) fn run(link: RankLink, job: Job) -> bool {
    POOL.get().is_some_and(|pool| pool.workers[link.worker].send(Message::Run(link.key, job)))
}

/// Drops the rank on its thread and returns once its sockets are closed.
pub(crate) fn remove(link: RankLink) {
    let Some(pool) = POOL.get() else { return };
    let (ack, acked) = mpsc::sync_channel(1);
    if pool.workers[link.worker].send(Message::Remove(link.key, ack)) {
        // A thread that is gone has dropped the rank already.
        let _ = acked.recv();
    }
}

/// The body of one rank thread.
struct RankThread {
    poll: Poll,
    ranks: HashMap<usize, RankState>,
    messages: Receiver<Message>,
    asleep: Arc<AtomicBool>,
}

impl RankThread {
    /// Handles queued messages, sleeps in epoll until a ROUTER or the waker signals (only
    /// peeks when it just handled messages, so ROUTERs are served under a stream of jobs too),
    /// serves the ROUTERs that signalled, and again.
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        loop {
            // Announce the sleep before the last look at the queue: a message queued after
            // the look sees the announcement and wakes the thread.
            self.asleep.store(true, Ordering::SeqCst);
            let Some(handled) = self.handle_queued() else { return };
            let timeout = (handled > 0).then_some(Duration::ZERO);
            if timeout.is_some() {
                self.asleep.store(false, Ordering::SeqCst);
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    warn!(error = %e, "rank thread: epoll failed");
                }
                continue;
            }
            self.asleep.store(false, Ordering::SeqCst);
            for event in events.iter().filter(|e| e.token() != WAKE) {
                // A stale registration (a closed socket's fd) may name a rank that is gone.
                if let Some(state) = self.ranks.get_mut(&event.token().0) {
                    serve(state);
                }
            }
        }
    }

    /// Handles every queued message; how many, or `None` once the pool is gone.
    fn handle_queued(&mut self) -> Option<usize> {
        let mut handled = 0;
        loop {
            match self.messages.try_recv() {
                Ok(message) => {
                    self.handle(message);
                    handled += 1;
                }
                Err(TryRecvError::Empty) => return Some(handled),
                Err(TryRecvError::Disconnected) => return None,
            }
        }
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Add(key, state, ack) => {
                self.ranks.insert(key, *state);
                self.watch(key);
                let _ = ack.send(());
            }
            Message::Run(key, job) => self.run_job(key, job),
            Message::Remove(key, ack) => {
                self.ranks.remove(&key);
                let _ = ack.send(());
            }
        }
    }

    /// Runs `job`; a job that panics takes its rank down (later calls get `RankStopped`), not
    /// the thread.
    fn run_job(&mut self, key: usize, job: Job) {
        let Some(state) = self.ranks.get_mut(&key) else { return };
        let before = state.incarnation();
        if catch_unwind(AssertUnwindSafe(|| job(state))).is_err() {
            warn!(engine = %state.engine(), rank = state.rank(), "a job panicked; rank stopped");
            self.ranks.remove(&key);
            return;
        }
        // Jobs use the PUB, not the ROUTER, so its fd's signal is intact; a restart made a new
        // ROUTER, whose fd must be watched.
        if state.incarnation() != before {
            self.watch(key);
        }
    }

    /// Registers the rank's ROUTER fd (edge-triggered) and serves what is already pending.
    /// Old fds are never deregistered: the kernel drops a closed fd from the set itself, and
    /// its number may already belong to another socket.
    fn watch(&mut self, key: usize) {
        let Some(state) = self.ranks.get_mut(&key) else { return };
        if let Some(fd) = state.router_fd() {
            let registry = self.poll.registry();
            let mut source = SourceFd(&fd);
            let registered = registry.register(&mut source, Token(key), Interest::READABLE);
            let registered = match registered {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    registry.reregister(&mut source, Token(key), Interest::READABLE)
                }
                other => other,
            };
            if let Err(e) = registered {
                warn!(engine = %state.engine(), rank = state.rank(), error = %e, "cannot watch the replay socket");
            }
        }
        serve(state);
    }
}

/// Answers every pending replay request of the rank, until `ZMQ_EVENTS` shows no more input
/// (the edge-triggered fd signals again only after that).
fn serve(state: &mut RankState) {
    loop {
        state.serve_replays();
        if !state.router_readable() {
            return;
        }
        debug!(rank = state.rank(), "replay input arrived while serving; serving again");
    }
}

/// The ZeroMQ contexts ranks' sockets are created in, each shared by up to
/// [`RANKS_PER_CONTEXT`] ranks.
static CONTEXTS: Mutex<Vec<(zmq::Context, Arc<()>)>> = Mutex::new(Vec::new());

/// A context with room for one more rank; the rank holds the returned token as long as it
/// lives, and the context's room comes back when it is dropped.
pub(crate) fn context() -> (zmq::Context, Arc<()>) {
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // A token's count minus the list's own reference is the ranks holding it.
    let room = contexts.iter().find(|(_, held)| Arc::strong_count(held) <= RANKS_PER_CONTEXT);
    if let Some((ctx, held)) = room {
        return (ctx.clone(), Arc::clone(held));
    }
    let (ctx, held) = (zmq::Context::new(), Arc::new(()));
    contexts.push((ctx.clone(), Arc::clone(&held)));
    (ctx, held)
}
