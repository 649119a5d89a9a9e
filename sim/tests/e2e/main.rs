//! The simulator's integration tests, one test binary with a module per area: its sockets
//! (live batches, snapshots, tiers, history replay, many engines), its etcd registration, its
//! OpenAI-compatible HTTP port and the `kvdir-sim` binary. [`common`] holds the socket helpers,
//! [`etcd_support`] and [`openai_support`] those of the etcd and OpenAI tests.

mod common;
mod etcd_support;
mod openai_support;

mod binary;
mod etcd;
mod live;
mod openai;
mod openai_stream;
mod scale;
mod snapshot;
mod tiers;
mod vllm_http;
mod vllm_replay;
