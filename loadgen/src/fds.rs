//! File descriptors of a run: the load tool raises its soft open-file limit to the hard one
//! ([`raise_limit`]), counts what the fleet needs ([`needed`]) and fails early, naming the
//! limit and the fix, when the run cannot fit ([`check`]).
//!
//! libzmq costs per simulated rank: the PUB's and the ROUTER's mailboxes ([`mailbox_fds`]
//! each: 1 eventfd, or a socketpair of 2 when libzmq was built without eventfd, see
//! `.cargo/config.toml`), the PUB's TCP listener and kvdir's connection to it, the ROUTER's
//! listener: 5 with eventfd. In bind-endpoint mode (`--events_bind`) the PUB connects to kvdir
//! instead, so it has no listener: 4. Every replay request kvdir makes holds one more
//! connection while it lasts (at the initial sync, up to one per stream at once), and every
//! ZeroMQ context and the rest of the tool a few more. docs/design.md ("The load tool's file
//! descriptors") explains why the bench does not share sockets between ranks to go lower.

use std::sync::OnceLock;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

use super::flags::BenchOptions;
use super::BenchError;
use kvdir_sim::pool::RANKS_PER_CONTEXT;

/// Descriptors per ZeroMQ context (its I/O thread's epoll and mailbox, the reaper's, the
/// context's own), with room to spare.
const PER_CONTEXT: u64 = 8;
/// The tool's other descriptors: HTTP clients, etcd, kvdir's pipes and log, epoll sets.
const BASE: u64 = 256;
/// Sockets opened to measure [`mailbox_fds`].
const PROBE_SOCKETS: usize = 32;
/// Replay connections budgeted at once (the initial sync can open one per stream).
const REPLAY_RESERVE: u64 = 1024;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now (`None`:
/// unlimited or unknown).
pub fn raise_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the open-file limit to the hard limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// Descriptors one ZeroMQ socket's mailbox holds in this build: 1 (eventfd) or 2 (a
/// socketpair), measured once over [`PROBE_SOCKETS`] sockets (so that descriptors other threads
/// open meanwhile hardly count).
pub fn mailbox_fds() -> u64 {
    static MEASURED: OnceLock<u64> = OnceLock::new();
    *MEASURED.get_or_init(|| {
        let ctx = zmq::Context::new();
        // The first socket also starts the context's own mailboxes.
        let Ok(_first) = ctx.socket(zmq::PUB) else { return 2 };
        let before = open_fds().unwrap_or(0);
        let sockets: Vec<_> =
            (0..PROBE_SOCKETS).filter_map(|_| ctx.socket(zmq::PUB).ok()).collect();
        let opened = open_fds().unwrap_or(0).saturating_sub(before) as f64;
        (opened / sockets.len().max(1) as f64).round().clamp(1.0, 2.0) as u64
    })
}

/// Descriptors one simulated rank holds: two mailboxes, the ROUTER's listener and the event
/// connection, and the PUB's listener unless it connects to kvdir.
pub fn per_rank(o: &BenchOptions) -> u64 {
    let listener = u64::from(o.events_bind.is_none());
    2 * mailbox_fds() + 2 + listener
}

/// Descriptors the run needs at most, replay connections of the initial sync included.
pub fn needed(o: &BenchOptions) -> u64 {
    let streams = u64::from(o.engines) * u64::from(o.dp_size);
    let contexts = streams.div_ceil(RANKS_PER_CONTEXT as u64);
    let clients = u64::from(o.query_clients + o.route_clients);
    streams * per_rank(o) + contexts * PER_CONTEXT + BASE + clients + streams.min(REPLAY_RESERVE)
}

/// Raises the limit and checks that the run fits under it; returns the limit.
pub fn check(o: &BenchOptions) -> Result<Option<u64>, BenchError> {
    let limit = raise_limit();
    let need = needed(o);
    match limit {
        Some(limit) if need > limit => Err(BenchError::Flags(vec![too_many(o, need, limit)])),
        _ => Ok(limit),
    }
}

fn too_many(o: &BenchOptions, need: u64, limit: u64) -> String {
    let streams = u64::from(o.engines) * u64::from(o.dp_size);
    let mut fix = match o.events_bind {
        None => "pass --events_bind P (kvdir binds, engines connect: one descriptor less per \
                 rank), run fewer streams, or raise the hard limit (ulimit -Hn, as root)"
            .to_string(),
        Some(_) => "run fewer streams, or raise the hard limit (ulimit -Hn, as root)".to_string(),
    };
    if mailbox_fds() > 1 {
        fix.push_str(
            "; this libzmq uses 2 descriptors per socket: build it with ZMQ_HAVE_EVENTFD \
             (.cargo/config.toml) for 1",
        );
    }
    format!(
        "--engines {} x --dp_size {} = {streams} streams need about {need} file descriptors in \
         this process ({} per rank, plus up to {} replay connections at the initial sync and \
         the rest), above its open-file limit of {limit} (RLIMIT_NOFILE, soft raised to hard); \
         {fix}",
        o.engines,
        o.dp_size,
        per_rank(o),
        streams.min(REPLAY_RESERVE)
    )
}

/// Descriptors this process has open now (`/proc/self/fd`).
pub fn open_fds() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd").ok().map(Iterator::count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_over_the_limit_fails_naming_the_limit_and_the_fix() {
        let o = BenchOptions { engines: 1024, dp_size: 4, ..BenchOptions::default() };
        let need = needed(&o);
        assert!(need > 4096 * 5, "{need}");
        let msg = too_many(&o, need, 20_000);
        assert!(msg.contains("4096 streams need about") && msg.contains("limit of 20000"), "{msg}");
        assert!(msg.contains("pass --events_bind P"), "{msg}");
        let connect = BenchOptions { events_bind: Some(5557), ..o.clone() };
        assert_eq!(per_rank(&connect) + 1, per_rank(&o), "a connecting PUB has no listener");
        assert_eq!(mailbox_fds(), 1, "libzmq is built with eventfd (.cargo/config.toml)");
        assert!(needed(&connect) < 20_000, "4,096 connecting ranks fit under 20,000");
        assert!(raise_limit().is_none_or(|l| l > 0));
        assert!(open_fds().is_some_and(|n| n > 0));
    }
}
