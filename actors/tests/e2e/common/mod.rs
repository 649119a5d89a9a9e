//! What the service's tests share: the service harness ([`service`]: kvdir in process over
//! simulated engines), the binary harness ([`binary`]: the `kvdir` executable), and the
//! workspace test kit (`kvdir_testkit`: polling with a deadline, HTTP, etcd).

pub mod binary;
pub mod engine_http;
pub mod logs;
pub mod service;

pub use binary::*;
pub use engine_http::TestEngine;
pub use kvdir_testkit::etcd::etcd_endpoint;
pub use kvdir_testkit::http::Response;
pub use kvdir_testkit::{eventually, Patience};
pub use logs::{capture_logs, captured_log, LogCapture};
pub use service::*;
