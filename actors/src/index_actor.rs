//! `IndexActor`: owns one stream's [`StreamWriter`] in the shared index of its block size and
//! seed, and applies what its stream sends, in order.
//!
//! Messages: [`ApplyBatch`], [`InstallSnapshot`], [`Invalidate`], [`GetIndexStatus`], `Shutdown`.
//! Every change is published at once, so readers see whole batches and whole snapshots (a
//! snapshot install and the deltas that continue it are one publish: a periodic resync never
//! goes dark). `Shutdown` drops the writer before it answers, so a stopped stream's bits and
//! entry are gone, and its slot free, once the stop is acknowledged.
//!
//! Each stream message carries the recovery epoch it was produced in; the stream's worker bumps
//! the shared epoch on every invalidation, so batches queued before a fault are dropped here
//! instead of being applied to a state they no longer continue. If the worker cannot even
//! deliver an invalidation (full mailbox), it leaves the reason in [`StreamShared`], which this
//! actor checks on every message and, as a fallback for a mailbox that emptied meanwhile, every
//! 50 ms (a faster timer cost more idle CPU across 128 streams than it bought).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use kvdir::index::{SharedSnapshot, StreamStatus, StreamWriter};
use kvdir::wire::Batch;

use crate::metrics::StreamCounters;

/// Mailbox capacity of an index actor; a full mailbox makes the stream resynchronize.
pub const INDEX_MAILBOX: usize = 256;

/// How often pending out-of-band invalidations are checked.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// State shared between a stream's worker thread and its index actor.
#[derive(Debug, Default)]
pub struct StreamShared {
    /// The worker's current recovery epoch.
    pub epoch: AtomicU64,
    /// An invalidation the worker could not deliver by message.
    pub pending_invalidation: Mutex<Option<String>>,
    /// Messages the worker could not deliver because the mailbox was full.
    pub mailbox_drops: AtomicU64,
    /// Live stores the index skipped as out of scope: children and tokenless replicas of
    /// out-of-scope blocks (the decoder counts the marked stores in the worker's status).
    pub skipped_out_of_scope: AtomicU64,
    /// Heap bytes of the live batches queued in the mailbox (bounded by `max_buffered_bytes`).
    pub queued_bytes: AtomicU64,
    /// The stream's instance name.
    pub instance: String,
    /// The stream's DP rank.
    pub dp_rank: u32,
    /// Counters for `/metrics`.
    pub counters: Arc<StreamCounters>,
}

impl StreamShared {
    /// Fresh shared state for the stream `instance`/`dp_rank`.
    pub fn new(instance: &str, dp_rank: u32) -> Self {
        StreamShared { instance: instance.to_string(), dp_rank, ..StreamShared::default() }
    }
}

/// The index failed to apply something: the worker must resynchronize.
#[derive(Debug, Clone)]
pub struct IndexFailed {
    /// Epoch of the message that failed.
    pub epoch: u64,
    /// The index error.
    pub reason: String,
}

/// Apply live batch `seq`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApplyBatch {
    /// Recovery epoch the batch belongs to.
    pub epoch: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The decoded batch.
    pub batch: Batch,
    /// Its share of [`StreamShared::queued_bytes`], released when it is handled.
    pub queued_bytes: u64,
}

/// Replace the contents with a snapshot and the deltas that continue it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstallSnapshot {
    /// Recovery epoch of the snapshot.
    pub epoch: u64,
    /// The snapshot, built on the worker thread.
    pub snapshot: Box<SharedSnapshot>,
    /// First live sequence not in the snapshot.
    pub watermark: u64,
    /// Consecutive live batches from the watermark on.
    pub deltas: Vec<(u64, Batch)>,
}

/// Stop giving credit: the stream lost continuity.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Invalidate {
    /// Why.
    pub reason: String,
}

/// Ask for the published status.
#[derive(Message)]
#[rtype(result = "StreamStatus")]
pub struct GetIndexStatus;

/// One stream's writer in the shared index.
pub struct IndexActor {
    /// `None` once the stream is shut down (its bits are removed).
    index: Option<StreamWriter>,
    shared: Arc<StreamShared>,
    feedback: Sender<IndexFailed>,
}

impl IndexActor {
    /// An actor around a stream's writer (fresh from [`crate::indexes::Indexes`]).
    pub fn new(
        index: StreamWriter,
        shared: Arc<StreamShared>,
        feedback: Sender<IndexFailed>,
    ) -> Self {
        IndexActor { index: Some(index), shared, feedback }
    }

    fn current(&self, epoch: u64) -> bool {
        epoch == self.shared.epoch.load(Ordering::Acquire)
    }

    /// Applies an undelivered invalidation, if any.
    fn check_pending(&mut self) {
        let pending = self.shared.pending_invalidation.lock().map(|mut p| p.take());
        if let (Ok(Some(reason)), Some(index)) = (pending, self.index.as_mut()) {
            index.invalidate(reason);
            index.publish();
        }
    }

    /// An injected stall (tests only): stop taking messages until released, as an actor
    /// starved of its arbiter would, while the thread keeps serving other actors.
    fn stall_if_held(&self, ctx: &mut Context<Self>) {
        let dp_rank = self.shared.dp_rank;
        if crate::faults::index_held(&self.shared.instance, dp_rank) {
            let instance = self.shared.instance.clone();
            ctx.wait(actix::fut::wrap_future(async move {
                while crate::faults::index_held(&instance, dp_rank) {
                    actix_rt::time::sleep(CHECK_INTERVAL).await;
                }
            }));
        }
    }

    fn apply(&mut self, epoch: u64, seq: u64, batch: &Batch) -> bool {
        let Some(index) = self.index.as_mut() else { return false };
        match index.apply(seq, batch) {
            Ok(stats) => {
                self.shared.counters.count_batch(batch);
                self.shared.skipped_out_of_scope.fetch_add(stats.out_of_scope, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::warn!(seq, error = %e, "batch rejected by the index; resynchronizing");
                let _ = self.feedback.send(IndexFailed { epoch, reason: e.to_string() });
                false
            }
        }
    }
}

impl Actor for IndexActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(INDEX_MAILBOX);
        ctx.run_interval(CHECK_INTERVAL, |a, ctx| {
            a.check_pending();
            a.stall_if_held(ctx);
        });
    }
}

impl Handler<ApplyBatch> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: ApplyBatch, ctx: &mut Context<Self>) {
        self.shared.queued_bytes.fetch_sub(msg.queued_bytes, Ordering::AcqRel);
        self.stall_if_held(ctx);
        self.check_pending();
        if self.current(msg.epoch) {
            self.apply(msg.epoch, msg.seq, &msg.batch);
            if let Some(index) = self.index.as_mut() {
                index.publish();
            }
        }
    }
}

impl Handler<InstallSnapshot> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: InstallSnapshot, _: &mut Context<Self>) {
        self.check_pending();
        if !self.current(msg.epoch) {
            return;
        }
        let Some(index) = self.index.as_mut() else { return };
        let was_synchronized = index.is_synchronized();
        let stats = index.install_snapshot(*msg.snapshot, msg.watermark);
        for (seq, batch) in &msg.deltas {
            if !self.apply(msg.epoch, *seq, batch) {
                break;
            }
        }
        let Some(index) = self.index.as_mut() else { return };
        // One publish: the old contents stay visible until the new ones replace them.
        index.publish();
        let (stream, dp, blocks) =
            (&self.shared.instance, self.shared.dp_rank, index.block_count());
        let (watermark, orphans) = (msg.watermark, stats.orphans);
        if was_synchronized {
            // A periodic resync: routine, every resync_interval_ms per stream.
            tracing::debug!(%stream, dp, watermark, blocks, orphans, "resync snapshot installed");
        } else {
            tracing::info!(%stream, dp, watermark, blocks, orphans, "synchronized by snapshot");
        }
    }
}

impl Handler<Invalidate> for IndexActor {
    type Result = ();

    fn handle(&mut self, msg: Invalidate, _: &mut Context<Self>) {
        self.check_pending();
        if let Some(index) = self.index.as_mut() {
            index.invalidate(msg.reason);
            index.publish();
        }
    }
}

impl Handler<crate::stream_actor::Shutdown> for IndexActor {
    type Result = ();

    fn handle(&mut self, _: crate::stream_actor::Shutdown, ctx: &mut Context<Self>) {
        // Dropping the writer removes the stream's bits and entry in one publish.
        self.index = None;
        ctx.stop();
    }
}

impl Handler<GetIndexStatus> for IndexActor {
    type Result = MessageResult<GetIndexStatus>;

    fn handle(&mut self, _: GetIndexStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.index.as_ref().map(StreamWriter::status).unwrap_or_else(|| {
            StreamStatus { error: Some("stream stopped".into()), ..StreamStatus::default() }
        }))
    }
}
