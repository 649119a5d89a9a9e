//! Handing the recovery machine's actions to the index actor: the message and byte bounds of
//! its mailbox, and what a refused or closed mailbox means for the stream.

use std::sync::atomic::Ordering;

use kvdir::wire::Batch;

use super::Worker;
use crate::index_actor::{ApplyBatch, IndexActor, Invalidate};

/// The outcome of handing a message to the index actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    Sent,
    /// The mailbox is full: counted, and the stream resynchronizes.
    Full,
    /// The actor has stopped: the stream is shutting down.
    Closed,
}

impl Worker {
    /// A live batch is also bounded in bytes: the mailbox may hold at most `max_buffered_bytes`
    /// of queued batches, however few messages that is. A batch is always taken by an empty
    /// queue, so one batch larger than the budget still gets through instead of looping.
    pub(super) fn deliver_batch(&self, epoch: u64, seq: u64, batch: Batch) -> Delivery {
        let bytes = batch.heap_bytes() as u64;
        let queued = &self.ctx.shared.queued_bytes;
        let budget = self.ctx.limits.max_buffered_bytes as u64;
        let before = queued.fetch_add(bytes, Ordering::AcqRel);
        if before > 0 && before.saturating_add(bytes) > budget {
            queued.fetch_sub(bytes, Ordering::AcqRel);
            return Delivery::Full;
        }
        let d = self.deliver(ApplyBatch { epoch, seq, batch, queued_bytes: bytes });
        if d != Delivery::Sent {
            queued.fetch_sub(bytes, Ordering::AcqRel);
        }
        d
    }

    pub(super) fn deliver<M>(&self, msg: M) -> Delivery
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        IndexActor: actix::Handler<M>,
    {
        match self.ctx.index.try_send(msg) {
            Ok(()) => Delivery::Sent,
            Err(actix::prelude::SendError::Full(_)) => Delivery::Full,
            Err(actix::prelude::SendError::Closed(_)) => Delivery::Closed,
        }
    }

    /// An invalidation that does not fit is left in the shared state for the index actor to
    /// pick up, so it counts as sent, not as a drop.
    pub(super) fn deliver_invalidation(&mut self, reason: String) -> Delivery {
        self.log_invalidation(&reason);
        self.status.last_fault = Some(reason.clone());
        match self.deliver(Invalidate { reason: reason.clone() }) {
            Delivery::Full => {
                self.defer_invalidation(reason);
                Delivery::Sent
            }
            other => other,
        }
    }

    fn log_invalidation(&mut self, reason: &str) {
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        if std::mem::take(&mut self.warn_on_invalidate) {
            tracing::warn!(%stream, dp, %reason, "stream unsynchronized");
        } else {
            tracing::debug!(%stream, dp, %reason, "stream still unsynchronized");
        }
    }

    fn defer_invalidation(&self, reason: String) {
        if let Ok(mut p) = self.ctx.shared.pending_invalidation.lock() {
            *p = Some(reason);
        }
    }
}
