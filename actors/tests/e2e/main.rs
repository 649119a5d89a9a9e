//! The service's integration tests, one test binary (one link, one process) with a module per
//! area, against the real parts: the `kvdir` binary or the service in process, real ZeroMQ on
//! loopback, real HTTP, a real etcd (`KVDIR_TEST_ETCD`, or a private one started by the test
//! kit) and the simulator as the engine. [`common`] is what the modules share.
//!
//! Tests run in parallel threads of this one process: a module that needs process-wide state
//! (the captured log, a block of engine ports) takes it through [`common`], never on its own.

mod common;

mod bench;
mod bench_chat;
mod binary;
mod bind_e2e;
mod compact_route_e2e;
mod deploy_configs;
mod discovery_e2e;
mod docs_paths;
mod engines_e2e;
mod fleet_e2e;
mod flood_e2e;
mod frontdoor_e2e;
mod frontdoor_engines_e2e;
mod http_api;
mod index_actor;
mod indexer_api_e2e;
mod kube_e2e;
mod liveness_e2e;
mod log_levels_e2e;
mod metrics_e2e;
mod mooncake_scale;
mod operations_doc;
mod predict_e2e;
mod replay;
mod route_e2e;
mod salt_route_e2e;
mod shutdown_e2e;
mod status_page;
mod streams_e2e;
mod supervision_e2e;
