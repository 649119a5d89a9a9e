//! kvdir core: the pure, synchronous part of the KV-cache directory. No actors, no sockets.
//!
//! - [`wire`]: live messages, snapshot replies, batches and events from engines: decoding every
//!   accepted dialect into a reusable batch, and encoders for the simulator and tests.
//! - [`index`]: content keys, each stream's engine-hash table and writer, and the shared index
//!   (one `content key -> stream sets` view per block size and seed, one walk per query) that
//!   the service queries.
//! - [`stream`]: one subscription's recovery state machine: sequence gaps, snapshots with
//!   buffered deltas, back-off and periodic resync, with time passed in.
//! - [`config`]: command-line flags and the `kv_events_config_file`, validated with every
//!   problem reported at once.
//! - [`query`]: the query endpoint's strict input parsing (with its scope: model, LoRA
//!   adapter, salt, tenant, instance) and its response types.
//! - [`indexer`]: the KV indexer API of Mooncake RFC #1403: register bodies and the RFC answer.
//! - [`metrics`]: a lock-free latency histogram and the Prometheus text format.
//! - [`backoff`]: the doubling retry delay every retry loop uses.
//! - [`audit`]: the cache-truth audit: kvdir's credit against the cached tokens engines report,
//!   per instance, with the warning rules; and reading `usage` from answers as they stream.
//! - [`overload`]: the front door's overload admission: a bounded FIFO of held requests.
//!
//! The contract is `docs/protocol.md`; the layout is in the README, the design notes in `docs/design.md`.

pub mod audit;
pub mod backoff;
pub mod car;
pub mod config;
pub mod index;
pub mod indexer;
pub mod metrics;
pub mod overload;
pub mod prometheus;
pub mod query;
pub mod registry;
pub mod stream;
pub mod wire;
