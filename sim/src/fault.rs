//! Faults a test can switch on per rank ([`Fault`]), and the rank's current fault state.
//!
//! Sequence numbers and the cache are the engine's truth; faults only decide what reaches the
//! wire. `DropNext` and `LoseTail` consume sequence numbers for batches that are never sent (a
//! visible gap, or a silent tail loss); `Quiet` models an engine that receives no requests, so
//! nothing changes at all.

/// How a rank answers replay requests: xLLM snapshots, or in the vLLM dialect the history
/// (where "the reply" is every requested batch and `Malformed` spoils each one's payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotMode {
    /// The reply, then the terminator.
    #[default]
    Normal,
    /// Never answer.
    Stall,
    /// Send the reply but never the terminator.
    Truncate,
    /// Send only the terminator, no payload.
    Refuse,
    /// Send a reply whose payload is not MessagePack, then the terminator.
    Malformed,
}

/// A misbehaviour of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next N batches consume a sequence number and change the cache, but are not sent: a
    /// sequence gap the subscriber can see.
    DropNext(u32),
    /// How snapshot requests are answered from now on.
    Snapshot(SnapshotMode),
    /// While true the engine receives no requests: `process`, `offload`, `evict` and `clear`
    /// change nothing, publish nothing, consume no sequence number and return `Ok(None)`.
    Quiet(bool),
    /// While true, batches change the cache and consume sequence numbers but are not sent: a
    /// silent tail loss that only a periodic snapshot can reveal.
    LoseTail(bool),
}

/// Payload bytes that are not MessagePack: `0xc1` is the one marker the format never uses.
pub fn malformed_payload() -> Vec<u8> {
    vec![0xc1, 0xc1, 0xc1, 0xc1]
}

/// A rank's current faults. Faults belong to the test harness, not to the engine process, so
/// they survive `restart`.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultState {
    drop_next: u32,
    lose_tail: bool,
    quiet: bool,
    pub(crate) snapshot: SnapshotMode,
}

impl FaultState {
    pub(crate) fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::DropNext(n) => self.drop_next = n,
            Fault::Snapshot(mode) => self.snapshot = mode,
            Fault::Quiet(on) => self.quiet = on,
            Fault::LoseTail(on) => self.lose_tail = on,
        }
    }

    pub(crate) fn quiet(&self) -> bool {
        self.quiet
    }

    /// Whether the batch about to be published must be withheld; counts down `DropNext`.
    pub(crate) fn withhold_next(&mut self) -> bool {
        if self.drop_next > 0 {
            self.drop_next -= 1;
            return true;
        }
        self.lose_tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_next_counts_down_and_lose_tail_is_unbounded() {
        let mut f = FaultState::default();
        f.apply(Fault::DropNext(2));
        assert_eq!([f.withhold_next(), f.withhold_next(), f.withhold_next()], [true, true, false]);
        f.apply(Fault::LoseTail(true));
        assert!((0..10).all(|_| f.withhold_next()));
        f.apply(Fault::LoseTail(false));
        assert!(!f.withhold_next());
    }

    #[test]
    fn malformed_payload_does_not_decode() {
        let mut batch = kvdir::wire::Batch::default();
        assert!(kvdir::wire::decode_batch(&malformed_payload(), &mut batch).is_err());
    }
}
