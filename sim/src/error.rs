//! [`SimError`], the one error type of the simulator. Messages name the offending value and,
//! where there is one, the fix.

use thiserror::Error;

/// Everything that can go wrong when starting or driving a simulated engine.
#[derive(Debug, Error)]
pub enum SimError {
    /// The engine configuration is invalid; every problem is listed.
    #[error("invalid engine config: {}", .0.join("; "))]
    Config(Vec<String>),
    /// Command-line flags are invalid; every problem is listed.
    #[error("invalid flags: {}; run kvdir-sim --help", .0.join("; "))]
    Flags(Vec<String>),
    /// A call named a rank the engine does not have.
    #[error("rank {rank} does not exist: the engine has dp_size = {dp_size} (ranks 0..{dp_size})")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// The engine's DP size.
        dp_size: u32,
    },
    /// A socket could not be bound.
    #[error("cannot bind {endpoint}: {source}; choose a free port, or 0 for an ephemeral one")]
    Bind {
        /// The endpoint that failed.
        endpoint: String,
        /// The ZeroMQ error.
        source: zmq::Error,
    },
    /// A connecting PUB socket could not connect.
    #[error("cannot connect the event socket to {endpoint}: {source}; give tcp://host:port")]
    Connect {
        /// The endpoint that failed.
        endpoint: String,
        /// The ZeroMQ error.
        source: zmq::Error,
    },
    /// Another ZeroMQ operation failed.
    #[error("rank {rank}: zmq {op} failed: {source}")]
    Zmq {
        /// The rank whose socket failed.
        rank: u32,
        /// What was being done.
        op: &'static str,
        /// The ZeroMQ error.
        source: zmq::Error,
    },
    /// A rank thread (or its epoll set) could not be started.
    #[error("rank thread {rank}: cannot start it: {source}")]
    Spawn {
        /// The rank.
        rank: u32,
        /// The OS error.
        source: std::io::Error,
    },
    /// The rank thread is gone (it panicked, or the engine is stopping).
    #[error("rank {rank}: the rank thread has stopped")]
    RankStopped {
        /// The rank.
        rank: u32,
    },
    /// The rank has no sockets because its last restart could not re-bind them.
    #[error("rank {rank} has no sockets: its last restart could not re-bind; call restart again")]
    NotBound {
        /// The rank.
        rank: u32,
    },
    /// An offload was asked of an engine without a Host tier.
    #[error(
        "rank {rank}: the Host tier is disabled (host_capacity_blocks = 0); \
         set host_capacity_blocks above 0 to offload"
    )]
    HostDisabled {
        /// The rank.
        rank: u32,
    },
    /// The engine's `/health` server could not be started.
    #[error("cannot serve /health on 127.0.0.1:{port}: {source}; choose a free http_port")]
    Http {
        /// The HTTP port.
        port: u16,
        /// The OS error.
        source: std::io::Error,
    },
    /// A registration option is invalid; every problem is listed.
    #[error("invalid registration: {}", .0.join("; "))]
    Registration(Vec<String>),
    /// An etcd operation failed or timed out.
    #[error("etcd at {endpoint}: {op} failed: {detail}")]
    Etcd {
        /// The etcd endpoint.
        endpoint: String,
        /// What was being done.
        op: &'static str,
        /// The client's error or "timed out after ...".
        detail: String,
    },
    /// The registration's worker thread is gone (it panicked, or the registration was killed).
    #[error("registration of {name}: the etcd worker thread has stopped")]
    RegistrationStopped {
        /// The instance name.
        name: String,
    },
}
