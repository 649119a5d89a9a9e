//! A stream's history-replay states, for engines whose replay endpoint sends past batches, not
//! state (vLLM, SGLang): [`StreamWriter::reset`] empties the stream,
//! [`StreamWriter::apply_unsynchronized`] applies the replayed batches while readers see
//! nothing, [`StreamWriter::resume`] makes it match again. A replay that does not reach back to
//! the engine's start leaves the stream *partial* ([`StreamWriter::set_partial`]) until the next
//! `AllBlocksCleared`.

use super::{ApplyStats, Pending, StreamWriter, SyncState};
use crate::index::IndexError;
use crate::wire::Batch;

impl StreamWriter {
    /// Marks the stream partial (its history did not reach back to the engine's start) or
    /// exact. While partial, [`Self::apply`] and [`Self::apply_unsynchronized`] skip and count
    /// ([`ApplyStats::unknown_parents`]) a store whose parent was never seen and a tokenless
    /// store of a hash never seen, instead of failing; removals and every other rule stay
    /// those of a live batch, so every credited block is one the engine stored and has not
    /// removed since. The flag clears itself at an `AllBlocksCleared` without a medium (the
    /// rest of that batch is applied exactly) and at a snapshot install.
    pub fn set_partial(&mut self, partial: bool) {
        self.partial = partial;
    }

    /// See [`Self::set_partial`].
    pub fn is_partial(&self) -> bool {
        self.partial
    }

    /// Applies batch `seq` of replayed history while the stream is unsynchronized (readers
    /// see nothing of it until [`Self::resume`]), with the rules of [`Self::apply`] but no
    /// check of the sync state, which it leaves as it is; it sets the sequence. An error
    /// leaves the stream unsynchronized with the error as its reason.
    pub fn apply_unsynchronized(
        &mut self,
        seq: u64,
        batch: &Batch,
    ) -> Result<ApplyStats, IndexError> {
        let stats = self.apply_table(batch)?;
        self.sequence = Some(seq);
        Ok(stats)
    }

    /// Empties the stream before a history replay: every block goes (readers lose them at
    /// the next publish), and so does the retired memory; the stream is unsynchronized
    /// ("reset for history replay") with no sequence. The partial flag is left as it is.
    pub fn reset(&mut self) {
        self.table.clear(None, &mut Pending(&mut self.pending));
        self.invalidate("reset for history replay");
        self.sequence = None;
    }

    /// Synchronizes the stream with its current contents (after a history replay): it matches
    /// from the next publish.
    pub fn resume(&mut self) {
        self.sync = SyncState::Synchronized;
    }
}
