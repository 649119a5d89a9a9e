//! kvdir service: the actors around the pure core, the HTTP API and start-up wiring.
//!
//! Modules by owner, in layers: each uses only modules listed before it (the test in
//! `layers.rs` reads every `crate::` reference and holds to this). `discovery`, `http` and
//! `sync` are private: only the service starts them.
//! - `sync`: locks that survive a panicked holder.
//! - [`faults`]: fault injection points for end-to-end tests (feature `fault-injection`);
//!   [`held_logs`]: stderr logs held back until the demo's banner is out.
//! - [`directory`]: the KV-cache directory, built first: the shared query indexes, the
//!   approximate credit of engines without KV events, and the lock-free, mailbox-free read
//!   path.
//! - [`router`]: `RouterActor`, routing from the hits read in the directory: rotation,
//!   requests in flight and recent decisions; it is given the directory when it is made.
//! - [`stream`]: one stream per instance and DP rank: `StreamSet` (given the directory and the
//!   router), the supervised `StreamActor`, its I/O thread (the single writer of its state)
//!   and the `IndexActor`, which owns the stream's writer of the shared index.
//! - `discovery`: `DiscoveryActor`, the owner of the instance set: the registry from etcd
//!   (list-then-watch, `/health` probes), the listed engines and stream reconciliation.
//! - `http`: routes and `ApiError`, the one place errors become status codes; the indexer
//!   API, the OpenAI front door, `/metrics` and the status page.
//! - [`service`]: starts the actors for a [`StartPlan`](service::StartPlan), then the HTTP
//!   server.
//! - [`demo`]: the zero-setup demo with in-process simulated engines.

pub mod demo;
pub mod directory;
mod discovery;
pub mod faults;
pub mod held_logs;
mod http;
#[cfg(test)]
mod layers;
pub mod router;
pub mod service;
pub mod stream;
mod sync;

pub use service::{Service, StartError};
