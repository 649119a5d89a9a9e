//! What the service's tests share: the service harness ([`service`]: kvdir in process over
//! simulated engines), the binary harness ([`binary`]: the `kvdir` executable), and the
//! workspace test kit (`kvdir_testkit`: polling with a deadline, HTTP, etcd).

// Each test crate compiles this module and uses only part of it.
#![allow(dead_code, unused_imports)]

pub mod binary;
pub mod engine_http;
pub mod logs;
pub mod service;

pub use binary::*;
pub use engine_http::{EngineState, TestEngine};
pub use kvdir_testkit::etcd::{etcd_endpoint, EtcdServer};
pub use kvdir_testkit::http::Response;
pub use kvdir_testkit::{eventually, eventually_within, DEADLINE};
pub use logs::{capture_logs, captured_log};
pub use service::*;
