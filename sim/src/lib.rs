//! kvdir-sim: a simulated xLLM (or vLLM) engine that speaks the publisher side of the kvdir wire contract
//! (`docs/protocol.md` sections 2 and 3), for end-to-end tests, benches and the demo.
//!
//! Module map:
//! - [`config`]: [`EngineConfig`] (ports, DP size, block size, tiers, wire forms, the
//!   [`Dialect`] imitated: xLLM or vLLM) and its validation, plus [`HashMode`], the shape of
//!   engine block hashes on the wire.
//! - [`cache`]: [`CacheModel`], one rank's prefix cache (Device LRU, optional Host LRU,
//!   leaf-first eviction) that turns requests into the events an engine would publish. Pure, no
//!   sockets.
//! - [`fault`]: [`Fault`] and [`SnapshotMode`], the misbehaviours tests can switch on.
//! - [`engine`]: [`SimEngine`]; each DP rank owns a PUB and a ROUTER socket (answering xLLM
//!   snapshots, or in the vLLM dialect replaying its buffered history) and lives on one of the
//!   process's few shared rank threads ([`pool`], event-driven over epoll); the public API
//!   sends a job to the rank's thread and waits for its answer, so a call returns only after
//!   its batch has been handed to the PUB socket.
//! - [`workload`]: a seeded synthetic workload (shared system prompts, multi-turn sessions).
//! - [`openai`]: the engine's business HTTP port (actix-web): `GET /health` and, with a text
//!   model ([`OpenAiConfig`]), OpenAI-compatible chat and completions that tokenize, hit and
//!   fill the prefix cache, publish its KV events and stream tokens.
//! - [`http`]: a tiny blocking HTTP client.
//! - [`etcd`]: [`Registration`], which registers an engine in etcd the way xLLM engines do
//!   (leased instance key, LOADMETRICS, heartbeats to kvdir), with knobs to pause, resume and
//!   kill it.
//! - [`cli`]: the `kvdir-sim` binary's flags and the static-stream JSON it prints (its flag
//!   parsing is shared with the load tool, the `kvdir-bench` crate).
//!
//! The crate's error type is [`SimError`].

#![forbid(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod config;
pub mod engine;
mod error;
pub mod etcd;
pub mod fault;
pub mod http;
pub mod openai;
pub mod pool;
mod process;
mod rank;
pub mod workload;

pub use cache::{block_hash, block_hashes, salted_block_hashes, CacheEvent, CacheModel};
pub use config::{Dialect, EngineConfig, HashMode, RankEndpoints, DEFAULT_BUFFER_STEPS};
pub use engine::{Pending, Published, SimEngine};
pub use error::SimError;
pub use etcd::{Registration, RegistrationOptions};
pub use fault::{malformed_payload, Fault, SnapshotMode};
pub use openai::server::{CACHED_TOKENS_HEADER, DP_RANK_HEADER};
pub use openai::{ApiError, CachedReport, InFlight, OpenAiConfig};
pub use pool::{rank_threads, set_rank_threads};
