//! One stream per instance and DP rank: its supervised actor, its worker on one of the I/O
//! threads and its writer in the shared index.
//!
//! - [`StreamSet`] (`set.rs`): starts and stops a stream's actor pair and its slot in the
//!   shared index; the one entry point for discovery, static config and `/register`.
//! - [`StreamActor`] (`actor.rs`): supervises the worker, restarts it with back-off, answers
//!   [`GetStreamReport`].
//! - [`IoPool`] (`pool/`): the fixed set of I/O threads that serve every stream's sockets.
//! - `worker/`: one stream on its thread: its live connection (or SUB socket and monitor),
//!   replay DEALER, decoding and recovery; it is the single writer of its stream's state.
//! - `frames.rs`: a message received into reused `zmq::Message`s, and each I/O thread's
//!   spare batch to decode into.
//! - `zmtp/`: kvdir's own ZMTP reader of the live streams it connects to.
//! - `sockets.rs`: the ZeroMQ context sized for `max_streams`, and the open-file limit and its
//!   budget ([`plan_fds`]).
//! - [`IndexActor`] (`index_actor.rs`): owns the writer's lifetime ([`Invalidate`],
//!   [`Shutdown`]).
//! - [`StreamCounters`] (`counters.rs`): the counters `/metrics` exposes.
//! - `bind.rs`: the endpoint engines connect to (`kv_events_bind`): its ports ([`bind_ports`]),
//!   read by the I/O threads, hand each message to its stream, routed by [`BindRoutes`].

mod actor;
mod bind;
mod counters;
mod frames;
mod index_actor;
mod pool;
mod set;
mod sockets;
mod worker;
mod zmtp;

pub use actor::{GetStreamReport, StreamActor, StreamOrigin, StreamReport};
pub use bind::{bind_ports, BindReport, BindRoutes};
pub use counters::StreamCounters;
pub use index_actor::{IndexActor, Invalidate, StreamShared};
pub use pool::{IoPool, IoThreadStats, PoolStats, MAX_IO_THREADS};
pub use set::{RunningStream, StartStreamError, StreamKey, StreamMap, StreamSet, StreamSource};
pub use sockets::{fd_limit, plan_fds};
pub use worker::WorkerStatus;

/// End a stream for good, sent to both of its actors: the `IndexActor` drops the writer (the
/// stream's bits leave the shared index) before it answers; the `StreamActor` takes its worker
/// off its I/O thread and ends once no address is left (a supervised actor that stops by itself would be
/// restarted).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Shutdown;
