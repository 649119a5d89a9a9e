//! [`IoPool`]: a fixed set of I/O threads (`io_threads`, default: the cores) that serve every
//! stream, instead of a thread per stream.
//!
//! Each stream is pinned to one thread, the least loaded when it is added, for its whole run;
//! that thread owns its sockets and its [`super::worker`] state, so the stream stays the single
//! writer of its part of the shared index. The bind endpoint's ports are spread over the
//! threads (rank r's on thread `r % threads`), and a bound stream is pinned to its rank's
//! thread, which reads the port and hands each message to its stream. Commands (add, remove,
//! a granted replay slot, a port, end) reach a thread through a mutex-guarded list and its
//! `mio::Waker`. How a thread waits and serves its streams is in `thread.rs`, its ports in
//! `ports.rs` (a port kvdir listens on itself, and the engines' connections to it, in
//! `listen.rs`); its recovery deadlines in `timers.rs`; the process-wide bound on replay DEALERs
//! in `replays.rs`.
//!
//! A stream that fails (a ZeroMQ error or a panic) leaves its thread, which reports the
//! reason through the stream's `exited` callback (its `StreamActor` restarts it after a
//! back-off). A stream short of a file descriptor does not fail: it waits on its thread and
//! tries again (`fds.rs`). [`IoPool::stop_and_join`] ends every thread and waits for them.

mod fds;
mod listen;
mod ports;
mod replays;
mod thread;
mod timers;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;

use fds::FdWaits;
pub use fds::{fd_backoff, is_out_of_fds};
pub use listen::Listener;
pub use ports::PortSocket;
pub use replays::ReplaySlot;
use replays::{Gate, Waiter};

use kvdir::config::is_bound;

use super::worker::WorkerCtx;
use super::BindRoutes;
use crate::sync::lock;

/// Most I/O threads (`io_threads` above this is clipped).
pub const MAX_IO_THREADS: usize = 64;

/// What a stream's thread reports when the stream fails (once, from the I/O thread).
pub type Exited = Box<dyn FnOnce(String) + Send>;

/// A stream to serve.
pub struct NewStream {
    /// Its settings, shared state and context.
    pub ctx: WorkerCtx,
    /// Called with the reason when the stream fails (not when it is removed or ends).
    pub exited: Exited,
}

/// A stream in the pool, to remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTicket {
    thread: usize,
    id: u64,
}

pub(crate) enum Command {
    Add(u64, Box<NewStream>),
    Remove(u64),
    /// A replay slot for the stream (see `replays.rs`).
    Granted(u64),
    /// A bound port of the bind endpoint to own and read: its rank, socket and routes.
    Port(u32, Box<PortSocket>, BindRoutes),
    End,
}

/// One thread's mailbox and load, shared with the pool.
struct ThreadRef {
    name: String,
    commands: Mutex<Vec<Command>>,
    waker: mio::Waker,
    /// Streams pinned to the thread (added minus removed or failed).
    streams: AtomicUsize,
}

impl ThreadRef {
    fn post(&self, c: Command) {
        lock(&self.commands).push(c);
        if let Err(e) = self.waker.wake() {
            tracing::error!(thread = %self.name, error = %e, "cannot wake an I/O thread");
        }
    }
}

/// What the threads share: their mailboxes, the replay gate and the waits for descriptors.
pub(crate) struct PoolShared {
    threads: Vec<ThreadRef>,
    gate: Mutex<Gate>,
    fds: FdWaits,
}

impl PoolShared {
    fn acquire(&self, w: Waiter) -> bool {
        lock(&self.gate).acquire(w)
    }

    fn release(&self) {
        let next = lock(&self.gate).release();
        if let Some(w) = next {
            self.threads[w.thread].post(Command::Granted(w.stream));
        }
    }

    fn cancel(&self, w: Waiter) {
        lock(&self.gate).cancel(w);
    }
}

/// One I/O thread as the streams report shows it.
#[derive(Debug, Clone, Serialize)]
pub struct IoThreadStats {
    /// The thread's name (as in `/proc/<pid>/task/*/comm`).
    pub name: String,
    /// Streams it serves.
    pub streams: usize,
}

/// The pool as the streams report and `/metrics` show it.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStats {
    /// Each I/O thread and its streams.
    pub io_threads: Vec<IoThreadStats>,
    /// Streams waiting for a replay slot (`max_concurrent_replays`).
    pub replays_waiting: usize,
    /// Times a stream or its replay found no file descriptor and backed off.
    pub fd_waits: u64,
    /// Streams waiting for descriptors to open their sockets.
    pub streams_waiting_for_fds: usize,
}

struct Inner {
    shared: Arc<PoolShared>,
    joins: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.shared.threads {
            t.post(Command::End);
        }
    }
}

/// The I/O threads of a service (cheap to clone).
#[derive(Clone)]
pub struct IoPool(Arc<Inner>);

static POOLS: AtomicUsize = AtomicUsize::new(0);

/// The threads for config `io_threads`: 0 means one per core; at most [`MAX_IO_THREADS`].
pub fn thread_count(io_threads: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let n = if io_threads == 0 { cores } else { io_threads };
    n.clamp(1, MAX_IO_THREADS)
}

impl IoPool {
    /// Starts `threads` I/O threads sharing `max_replays` replay slots.
    pub fn start(threads: usize, max_replays: usize) -> std::io::Result<IoPool> {
        let pool = POOLS.fetch_add(1, Ordering::Relaxed);
        let mut polls = Vec::with_capacity(threads);
        let mut refs = Vec::with_capacity(threads);
        for i in 0..threads {
            let poll = mio::Poll::new()?;
            let waker = mio::Waker::new(poll.registry(), thread::WAKER)?;
            // Linux keeps 15 bytes of a thread name: "kvdir-io<pool>.<i>".
            let name = format!("kvdir-io{pool}.{i}");
            let commands = Mutex::default();
            refs.push(ThreadRef { name, commands, waker, streams: AtomicUsize::new(0) });
            polls.push(poll);
        }
        let gate = Mutex::new(Gate::new(max_replays.max(1)));
        let shared = Arc::new(PoolShared { threads: refs, gate, fds: FdWaits::default() });
        let mut joins = Vec::with_capacity(threads);
        for (i, poll) in polls.into_iter().enumerate() {
            let t = thread::PoolThread::new(i, poll, Arc::clone(&shared))?;
            let name = shared.threads[i].name.clone();
            let spawned = std::thread::Builder::new().name(name).spawn(move || t.run());
            match spawned {
                Ok(h) => joins.push(h),
                Err(e) => {
                    let pool = IoPool(Arc::new(Inner { shared, joins: Mutex::new(joins) }));
                    pool.stop_and_join();
                    return Err(e);
                }
            }
        }
        Ok(IoPool(Arc::new(Inner { shared, joins: Mutex::new(joins) })))
    }

    /// Pins a stream to a thread, where its sockets open: a bound stream of rank r to the
    /// thread that owns rank r's port (`r % threads`), any other to the least loaded.
    pub fn add(&self, id: u64, stream: NewStream) -> StreamTicket {
        let threads = &self.0.shared.threads;
        let spec = &stream.ctx.spec;
        let thread = match is_bound(&spec.endpoint) {
            true => spec.dp_rank as usize % threads.len(),
            false => {
                let loads = threads.iter().map(|t| t.streams.load(Ordering::Relaxed));
                loads.enumerate().min_by_key(|(_, n)| *n).map_or(0, |(i, _)| i)
            }
        };
        let t = &threads[thread];
        t.streams.fetch_add(1, Ordering::Relaxed);
        t.post(Command::Add(id, Box::new(stream)));
        StreamTicket { thread, id }
    }

    /// Hands rank `rank`'s bound port to thread `rank % threads`, which reads it from then on.
    pub fn attach_port(&self, rank: u32, socket: PortSocket, routes: BindRoutes) {
        let threads = &self.0.shared.threads;
        threads[rank as usize % threads.len()].post(Command::Port(rank, Box::new(socket), routes));
    }

    /// Removes a stream (its sockets close on its thread); a stream gone already is ignored.
    pub fn remove(&self, ticket: StreamTicket) {
        self.0.shared.threads[ticket.thread].post(Command::Remove(ticket.id));
    }

    /// The threads and their streams.
    pub fn stats(&self) -> PoolStats {
        let shared = &self.0.shared;
        let io_threads = shared
            .threads
            .iter()
            .map(|t| IoThreadStats {
                name: t.name.clone(),
                streams: t.streams.load(Ordering::Relaxed),
            })
            .collect();
        let (fd_waits, streams_waiting_for_fds) = shared.fds.counts();
        let replays_waiting = lock(&shared.gate).waiting();
        PoolStats { io_threads, replays_waiting, fd_waits, streams_waiting_for_fds }
    }

    /// Ends every thread (their streams' sockets close) and waits for them.
    pub fn stop_and_join(&self) {
        for t in &self.0.shared.threads {
            t.post(Command::End);
        }
        let joins = std::mem::take(&mut *lock(&self.0.joins));
        for h in joins {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;
