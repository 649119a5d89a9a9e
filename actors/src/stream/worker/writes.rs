//! The worker's writes to its stream's state in the shared index: live batches, snapshot
//! installs and invalidations, made visible to queries together by one publish per turn.

use std::sync::atomic::Ordering;
use std::time::Instant;

use kvdir::index::{ApplyStats, AttentionClass, IndexError, SharedSnapshot, StreamWriter};
use kvdir::stream::StreamFault;
use kvdir::wire::{AttentionKind, Batch};

use super::Worker;

impl Worker {
    /// Runs `f` on the stream's writer; a writer that is gone (the stream is being stopped)
    /// ends the stream.
    fn write<T>(&mut self, f: impl FnOnce(&mut StreamWriter) -> T) -> Option<T> {
        let out = self.ctx.shared.with_writer(f);
        match out {
            Some(_) => self.dirty = true,
            None => {
                self.ended = true;
                self.actions.clear();
            }
        }
        out
    }

    /// Applies a live batch; an index error resynchronizes the stream.
    pub(super) fn apply(&mut self, seq: u64, batch: &Batch, now: Instant) {
        let out = self.write(|w| w.apply(seq, batch));
        self.applied(out, seq, batch, now);
    }

    /// Counts an applied batch, or turns the index's refusal into a stream fault.
    fn applied(
        &mut self,
        out: Option<Result<ApplyStats, IndexError>>,
        seq: u64,
        batch: &Batch,
        now: Instant,
    ) {
        match out {
            Some(Ok(stats)) => {
                let shared = &self.ctx.shared;
                shared.counters.count_batch(batch);
                shared.skipped_out_of_scope.fetch_add(stats.out_of_scope, Ordering::Relaxed);
            }
            Some(Err(e)) => {
                self.fault(StreamFault::IndexRejected { seq, error: e.to_string() }, seq, now);
            }
            None => {}
        }
    }

    /// Installs a snapshot and the deltas that continue it, published together.
    pub(super) fn install(
        &mut self,
        snapshot: SharedSnapshot,
        watermark: u64,
        deltas: &[(u64, Batch)],
        now: Instant,
    ) {
        let Some((was_synchronized, orphans, blocks)) = self.write(|w| {
            let was = w.is_synchronized();
            let stats = w.install_snapshot(snapshot, watermark);
            (was, stats.orphans, w.block_count())
        }) else {
            return;
        };
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        if was_synchronized {
            // A periodic resync: routine, every resync_interval_ms per stream.
            tracing::debug!(%stream, dp, watermark, blocks, orphans, "resync snapshot installed");
        } else {
            tracing::info!(%stream, dp, watermark, blocks, orphans, "synchronized by snapshot");
        }
        for (seq, batch) in deltas {
            self.apply(*seq, batch, now);
            if !self.actions.is_empty() {
                break; // rejected: the recovery machine takes over
            }
        }
    }

    /// History replay: drops every block; the stream stays unsynchronized until resumed, and
    /// with `partial` knows only what it learns from then on.
    pub(super) fn reset(&mut self, partial: bool) {
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        if partial {
            tracing::info!(%stream, dp, "history truncated: blocks dropped, the stream goes on as partial");
        }
        self.write(|w| {
            w.reset();
            w.set_partial(partial);
        });
    }

    /// History replay: applies a replayed (or buffered) batch while unsynchronized; an index
    /// error resynchronizes the stream.
    pub(super) fn recover(&mut self, seq: u64, batch: &Batch, now: Instant) {
        let out = self.write(|w| w.apply_unsynchronized(seq, batch));
        self.applied(out, seq, batch, now);
    }

    /// History replay complete: the stream gives credit again (exact or partial).
    pub(super) fn resume(&mut self) {
        let partial = self.recovery.is_partial();
        let next = self.recovery.next_seq();
        let Some(blocks) = self.write(|w| {
            w.resume();
            w.block_count()
        }) else {
            return;
        };
        let state = if partial { "partial" } else { "exact" };
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        tracing::info!(%stream, dp, state, next_seq = ?next, blocks, "synchronized by history replay");
    }

    /// Stops giving credit, visible at the end of this turn.
    pub(super) fn invalidate(&mut self, fault: StreamFault) {
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        let (reason, text) = (fault.label(), fault.to_string());
        if std::mem::take(&mut self.warn_on_invalidate) {
            tracing::warn!(%stream, dp, reason, fault = %text, "stream unsynchronized");
        } else {
            tracing::debug!(%stream, dp, reason, fault = %text, "stream still unsynchronized");
        }
        self.ctx.shared.counters.count_fault(&fault);
        self.status.last_fault = Some(text.clone());
        self.write(|w| w.invalidate(text));
    }

    /// Makes everything this turn changed visible to queries at once.
    pub(super) fn publish(&mut self) {
        if std::mem::take(&mut self.dirty) {
            let hybrid = self.ctx.shared.with_writer(|w| {
                w.publish();
                w.hybrid().map(|(classes, unlocated)| (classes.to_vec(), unlocated))
            });
            if let Some(Some((classes, unlocated))) = hybrid {
                self.hybrid_status(&classes, unlocated);
            }
        }
    }

    /// A hybrid stream's classes in its report; once per worker, the setting that makes its
    /// credit exact when its window stores cannot be located.
    fn hybrid_status(&mut self, classes: &[AttentionClass], unlocated: u64) {
        let names = classes.iter().map(|c| format!("{} x{}", c.kind, c.groups.count_ones()));
        self.status.attention = names.collect();
        self.status.unlocated_blocks = unlocated;
        if self.hybrid_advised {
            return;
        }
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        let unmodelled = classes.iter().find(|c| matches!(c.kind, AttentionKind::Unmodelled(_)));
        let windows_alone = classes.first().is_some_and(|c| c.kind != AttentionKind::Full);
        if let Some(c) = unmodelled {
            self.hybrid_advised = true;
            tracing::warn!(%stream, dp, kind = %c.kind, "this model has a KV cache group of a \
                kind kvdir does not model: the stream gives no credit");
        } else if unlocated > 0 && windows_alone {
            self.hybrid_advised = true;
            let block_size = self.ctx.spec.block_size;
            tracing::warn!(%stream, dp, "sliding-window stores with no full-attention group \
                cannot be located, and their blocks give no credit; start vLLM with \
                --prefix-cache-retention-interval {block_size} for exact credit");
        }
    }
}
