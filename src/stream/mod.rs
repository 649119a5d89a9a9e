//! One subscription's recovery logic (protocol.md section 3), as a pure state machine.
//!
//! The stream actor owns the sockets and feeds [`Recovery`] what happens (live batches,
//! snapshot replies, connects, disconnects, faults, clock ticks); the machine answers with
//! [`Action`]s: apply a batch, invalidate (with a typed [`StreamFault`]), request or install a
//! snapshot. Time is passed in, so
//! every rule (gaps, restarts, timeouts, budgets, back-off, periodic resync) is tested here
//! without sockets or sleeps.
//!
//! Phases: `Disconnected` -> (connected) `Syncing` -> (snapshot complete) `Live`;
//! a gap, a restart or a fault in `Live` goes back to `Syncing`; a failed snapshot waits in
//! `Backoff`, then syncs again; a full-state live batch restores `Live` from any phase.

mod actions;
mod copies;
mod fault;
mod history;
mod recovery;
mod snapshot;

pub use actions::{Action, RecoveryConfig, RecoveryStats, StreamPhase, SyncReason};
pub use fault::{StreamFault, FAULT_LABELS};
pub use recovery::{Recovery, MAX_FAILED_RESYNCS};

#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod resync_tests;
#[cfg(test)]
mod tests;
