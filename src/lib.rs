//! kvdir core: the pure, synchronous part of the KV-cache directory. No actors, no sockets.
//!
//! The modules form layers: each uses only modules of the layers below it, so there is no
//! import cycle (the test in `layers.rs` reads every `crate::` reference and holds to this).
//!
//! 0. No other module of the crate:
//!    - [`wire`]: live messages, snapshot replies, batches and events from engines: decoding
//!      every accepted dialect into a reusable batch, encoders for the simulator and tests,
//!      and the content-key [`wire::Namespace`] tags the decoder reads;
//!    - [`registry`]: the instance registry xLLM keeps in etcd: keys, values, an instance's
//!      type, load and process identity, and the instance state machine;
//!    - [`backoff`]: the doubling retry delay every retry loop uses;
//!    - [`metrics`]: a lock-free latency histogram and the Prometheus text format writer;
//!    - [`prometheus`]: a reader of the Prometheus text format (engines' `/metrics`);
//!    - [`overload`]: the front door's overload admission: a bounded FIFO of held requests.
//! 1. [`index`] (uses `wire`, `registry`): content keys, each stream's engine-hash table and
//!    writer, and the shared index (one `content key -> stream sets` view per block size and
//!    seed, one walk per query) that the service queries.
//! 2. Over the index:
//!    - [`car`] (`index`, `registry`): routing, with CAR, the protocol's cache-aware routing,
//!      as its default policy, and RR, SLO_AWARE and TTFT beside it;
//!    - [`query`] (`index`): the query endpoint's strict input parsing (with its scope: model,
//!      LoRA adapter, salt, tenant, instance) and its response types.
//! 3. Settings and checks over routing:
//!    - [`config`] (`car`, `index`, `overload`, `registry`): command-line flags and the
//!      `kv_events_config_file`, validated with every problem reported at once, into the
//!      settings types of the modules below;
//!    - [`audit`] (`car`): the cache-truth audit: kvdir's credit against the cached tokens
//!      engines report, per instance, with the warning rules; and reading `usage` from
//!      answers as they stream.
//! 4. Over the config:
//!    - [`stream`] (`backoff`, `config`, `index`, `wire`): one subscription's recovery state
//!      machine: sequence gaps, snapshots with buffered deltas, back-off and periodic resync,
//!      with time passed in;
//!    - [`discovery`] (`car`, `config`, `prometheus`, `registry`): the streams to run for the
//!      instance set, and the state of engines listed by address;
//!    - [`indexer_api`] (`config`, `query`): the KV indexer API of Mooncake RFC #1403: register
//!      bodies and the RFC answer.
//!
//! The contract is `docs/protocol.md`; the layout is in docs/architecture.md, the design notes
//! in `docs/design.md`.

pub mod audit;
pub mod backoff;
pub mod car;
pub mod config;
pub mod discovery;
pub mod index;
pub mod indexer_api;
pub mod metrics;
pub mod overload;
pub mod prometheus;
pub mod query;
pub mod registry;
pub mod stream;
pub mod wire;

#[cfg(test)]
mod layers;
