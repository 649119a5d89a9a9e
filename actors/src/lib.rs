//! kvdir service: the actors around the pure core, the HTTP API and start-up wiring.
//!
//! Modules by owner, each depending only on those listed before it (`discovery`, `http` and
//! `sync` are private: only the service starts them):
//! - `sync`: locks that survive a panicked holder; [`faults`]: fault injection points for
//!   end-to-end tests (feature `fault-injection`).
//! - [`directory`]: the KV-cache directory: the shared query indexes (and the approximate
//!   credit of engines without KV events) and the lock-free, mailbox-free read path.
//! - [`router`]: `RouterActor`, routing decisions: rotation, requests in flight and recent
//!   decisions.
//! - [`stream`]: one stream per instance and DP rank: `StreamSet`, the supervised
//!   `StreamActor`, its I/O thread (the single writer of its state) and the `IndexActor`.
//! - `discovery`: `DiscoveryActor`, the instance registry from etcd (list-then-watch,
//!   `/health` probes) and stream reconciliation.
//! - `http`: routes and `ApiError`, the one place errors become status codes; the indexer
//!   API, the OpenAI front door, `/metrics` and the status page.
//! - [`service`]: starts the actors for a configuration, then the HTTP server; [`demo`]: the
//!   zero-setup demo with in-process simulated engines; [`held_logs`]: stderr logs held back
//!   until the demo's banner is out.

pub mod demo;
pub mod directory;
mod discovery;
pub mod faults;
pub mod held_logs;
mod http;
pub mod router;
pub mod service;
pub mod stream;
mod sync;

pub use service::{Service, StartError};
