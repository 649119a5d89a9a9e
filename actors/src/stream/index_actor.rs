//! `IndexActor`: owns one stream's writer ([`StreamWriter`]) of the shared index of its block
//! size and seed, in the service's [`Directory`](crate::directory::Directory).
//!
//! The stream's own thread (the worker) is the single writer: it applies live batches, installs
//! snapshots and invalidates through [`StreamShared::with_writer`] and publishes once per poll,
//! with no mailbox hop and no back-channel: an index error goes straight into the worker's
//! recovery machine. Readers see whole batches and whole snapshots (a snapshot install and the
//! deltas that continue it are one publish: a periodic resync never goes dark).
//!
//! This actor owns the writer's lifetime. Messages: [`Invalidate`] (a
//! failed worker must stop giving credit before its successor runs) and `Shutdown`, which drops
//! the writer before it answers, so a stopped stream's bits and entry are gone, and its slot
//! free, once the stop is acknowledged; a worker that finds the writer gone stops.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use actix::prelude::*;
use kvdir::index::StreamWriter;
use kvdir::stream::StreamFault;

use super::StreamCounters;

/// State shared between a stream's worker thread and its actors.
#[derive(Debug)]
pub struct StreamShared {
    /// The stream's writer; `None` once the stream is shut down (its bits are removed).
    writer: Mutex<Option<StreamWriter>>,
    /// Live stores the index skipped as out of scope: children and tokenless replicas of
    /// out-of-scope blocks (the decoder counts the marked stores in the worker's status).
    pub skipped_out_of_scope: AtomicU64,
    /// The stream's instance name.
    pub instance: String,
    /// The stream's DP rank.
    pub dp_rank: u32,
    /// Counters for `/metrics`.
    pub counters: Arc<StreamCounters>,
}

impl StreamShared {
    /// Shared state of the stream `instance`/`dp_rank` around its fresh `writer`.
    pub fn new(instance: &str, dp_rank: u32, writer: StreamWriter) -> Self {
        StreamShared {
            writer: Mutex::new(Some(writer)),
            skipped_out_of_scope: AtomicU64::new(0),
            instance: instance.to_string(),
            dp_rank,
            counters: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<StreamWriter>> {
        // A panic while applying leaves the writer as consistent as any error would: the
        // worker that panicked is replaced and invalidates it first.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the writer; `None` once the stream is shut down.
    pub fn with_writer<T>(&self, f: impl FnOnce(&mut StreamWriter) -> T) -> Option<T> {
        self.lock().as_mut().map(f)
    }

    /// Drops the writer: the stream's bits and entry leave the shared index in one publish.
    pub fn shut_down(&self) {
        let writer = self.lock().take();
        drop(writer);
    }
}

/// Stop giving credit: the stream's worker failed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Invalidate {
    /// Why.
    pub fault: StreamFault,
}

/// Owns one stream's writer of the shared index (its lifetime; the worker writes through it).
pub struct IndexActor {
    shared: Arc<StreamShared>,
}

impl IndexActor {
    /// The owner of `shared`'s writer.
    pub fn new(shared: Arc<StreamShared>) -> Self {
        IndexActor { shared }
    }
}

impl Actor for IndexActor {
    type Context = Context<Self>;
}

impl Handler<Invalidate> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: Invalidate, _: &mut Context<Self>) {
        self.shared.counters.count_fault(&msg.fault);
        self.shared.with_writer(|w| {
            w.invalidate(msg.fault.to_string());
            w.publish();
        });
    }
}

impl Handler<super::Shutdown> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: super::Shutdown, ctx: &mut Context<Self>) {
        self.shared.shut_down();
        ctx.stop();
    }
}
