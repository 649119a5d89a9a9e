//! One stream per instance and DP rank: its supervised actor, its I/O thread and its writer in
//! the shared index.
//!
//! - [`StreamSet`] (`set.rs`): starts and stops a stream's actor pair and its slot in the
//!   shared index; the one entry point for discovery, static config and `/register`.
//! - [`StreamActor`] (`actor.rs`): supervises the worker thread, restarts it with back-off,
//!   answers [`GetStreamReport`].
//! - `worker.rs`: the thread: SUB socket, monitor, snapshot DEALER, decoding and recovery; it
//!   is the single writer of its stream's state.
//! - [`IndexActor`] (`index_actor.rs`): owns the writer's lifetime ([`Invalidate`],
//!   [`Shutdown`]).
//! - [`StreamCounters`] (`counters.rs`): the counters `/metrics` exposes.
//! - [`BindReceiver`] (`bind.rs`): the endpoint engines connect to (`kv_events_bind`); it hands
//!   each message to its stream through an in-process socket, routed by [`BindRoutes`].

mod actor;
mod bind;
mod counters;
mod index_actor;
mod set;
mod worker;

pub use actor::{GetStreamReport, StreamActor, StreamReport, WorkerThreads};
pub use bind::{BindReceiver, BindReport, BindRoutes};
pub use counters::StreamCounters;
pub use index_actor::{IndexActor, Invalidate, StreamShared};
pub use set::{RunningStream, StartStreamError, StreamMap, StreamSet, StreamSource};
pub use worker::WorkerStatus;

/// End a stream for good, sent to both of its actors: the `IndexActor` drops the writer (the
/// stream's bits leave the shared index) before it answers; the `StreamActor` stops its worker
/// thread and ends once no address is left (a supervised actor that stops by itself would be
/// restarted).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Shutdown;
