//! kvdir core: the pure, synchronous part of the KV-cache directory. No actors, no sockets.
//!
//! - [`wire`]: live messages, snapshot replies, batches and events from engines: decoding every
//!   accepted dialect into a reusable batch, and encoders for the simulator and tests.
//! - [`index`]: content keys, one stream's tiered prefix index (engine-hash map, limits,
//!   snapshots) and its lock-free read view with prefix matching.
//!
//! The contract is `shared/docs/protocol.md`; the layout is `shared/docs/architecture.md`.

pub mod index;
pub mod wire;
