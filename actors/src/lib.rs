//! kvdir service: the actors around the pure core, the HTTP API and start-up wiring.
//!
//! - [`service`]: starts the actors for a configuration, then the HTTP server.
//! - [`demo`]: the zero-setup demo with in-process simulated engines.
//! - [`discovery`]: `DiscoveryActor`, the instance registry from etcd and stream reconciliation.
//! - [`etcd_watch`]: list-then-watch of the registry keys, and the `/health` probe.
//! - [`faults`]: fault injection points for end-to-end tests (feature `fault-injection`).
//! - [`streams`]: starting and stopping a stream's actor pair.
//! - [`stream_actor`]: `StreamActor`, one supervised subscription per instance/DP.
//! - [`worker`]: the stream's I/O thread: SUB, monitor and snapshot DEALER, recovery.
//! - [`indexes`]: the shared query indexes and the lock-free, mailbox-free read path.
//! - [`index_actor`]: `IndexActor`, the owner of one stream's writer in its shared index (its stream
//!   thread is the single writer).
//! - [`sync`]: locks that survive a panicked holder.
//! - [`metrics`]: per-stream and request counters and the `/metrics` rendering.
//! - [`router_actor`]: `RouterActor`, routing decisions: rotation and recent decisions.
//! - [`route_predict`]: predict-on-route, between a request's hits and the router's predictions.
//! - [`http`]: routes and `ApiError`, the one place errors become status codes.
//! - [`status_page`]: the live status page at `/` (one embedded HTML file).

pub mod demo;
pub mod discovery;
pub mod etcd_watch;
pub mod faults;
pub mod frontdoor;
pub mod http;
pub mod index_actor;
pub mod indexer_api;
pub mod indexes;
pub mod metrics;
pub mod route_predict;
pub mod router_actor;
pub mod service;
pub mod status_page;
pub mod stream_actor;
pub mod streams;
pub mod sync;
pub mod worker;

pub use service::{Service, StartError};
