//! The open-file budget ([`FdBudget`]): what the streams, their replays and the HTTP
//! connections cost in file descriptors, and how many streams and concurrent replays a
//! `RLIMIT_NOFILE` allows. Pure arithmetic: the service reads the limit at start, logs the
//! plan and sizes the replay slots (`max_concurrent_replays`) from it.
//!
//! Invariant: with `max_streams` streams, `replays` replay DEALERs open at once and
//! `http_connections` HTTP connections, the process stays within the limit, less
//! [`RESERVED_FDS`] for what it holds otherwise; when even one replay does not fit beside
//! `max_streams` streams, the plan says how many streams do ([`FdBudget::streams_allowed`]).
//!
//! A closed ZeroMQ socket keeps its descriptors until libzmq's reaper destroys it, which lags
//! behind by seconds when kvdir is busy: a periodic resync of 4,096 streams closed DEALERs
//! faster than they went, and 1,400 of them held 2,800 descriptors beyond the replay slots
//! until the limit was reached. libzmq counts such a socket against the context's socket limit
//! until it is gone, so that limit ([`FdBudget::zmq_sockets`]) is set to what the descriptors
//! hold: a socket that does not fit fails to open with `EMFILE`, and the stream waits for it
//! as for a descriptor, while HTTP, etcd and the other streams keep theirs.

use super::Limits;

/// Descriptors the process holds besides its streams, replays and HTTP connections: standard
/// streams, the `epoll`s and wakers of the I/O and HTTP threads, libzmq's I/O thread and reaper,
/// etcd and engine connections, files opened for `/proc`.
pub const RESERVED_FDS: u64 = 256;
/// A stream kvdir connects to: its SUB socket's mailbox and TCP connection, and the socket
/// monitor pair (libzmq with eventfd mailboxes, as this build has).
pub const CONNECTED_STREAM_FDS: u64 = 4;
/// A stream on the bind endpoint: its engine's TCP connection to the bound port (the port's
/// socket is the I/O thread's; the stream has none of its own).
pub const BOUND_STREAM_FDS: u64 = 1;
/// An open replay DEALER: its mailbox and TCP connection.
pub const REPLAY_FDS: u64 = 2;
/// libzmq sockets of a stream kvdir connects to at a host name: the SUB and its monitor pair
/// (libzmq's end and kvdir's), each with a mailbox descriptor ([`CONNECTED_STREAM_FDS`] with
/// the SUB's TCP connection). A stream at an IP address (read by kvdir's ZMTP reader, 1
/// descriptor) has none, and closing DEALERs may take its 3: 6 descriptors against the 3 it
/// leaves, so there the limit is loose by up to 3 a stream. One on the bind endpoint has none
/// and is counted with none.
pub const CONNECTED_STREAM_SOCKETS: usize = 3;
/// libzmq sockets beyond the streams' and the replays': the bind endpoint's ports (one per DP
/// rank) and the like, within [`RESERVED_FDS`].
pub const SPARE_SOCKETS: usize = 64;

/// How the streams of a kvdir reach their engines, for the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// kvdir connects to every engine (or may: static streams, listed or registered engines).
    Connected,
    /// Every engine connects to kvdir's bind endpoint.
    Bound,
}

impl StreamKind {
    /// Descriptors one stream of this kind holds.
    pub fn fds(self) -> u64 {
        match self {
            StreamKind::Connected => CONNECTED_STREAM_FDS,
            StreamKind::Bound => BOUND_STREAM_FDS,
        }
    }
}

/// The plan for one open-file limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdBudget {
    /// The soft `RLIMIT_NOFILE` (after raising it to the hard one); `None`: unlimited.
    pub limit: Option<u64>,
    /// HTTP connections the server keeps open at most (`--http_max_connections`).
    pub http_connections: u64,
    /// The streams' kind the budget is made for.
    pub kind: StreamKind,
    /// Replay DEALERs that may exist at once, open or closed but not yet destroyed by libzmq:
    /// every descriptor left beside the streams, HTTP and the reserve ([`REPLAY_FDS`] each),
    /// at least `replays`.
    pub replay_sockets: usize,
    /// Streams the config allows (`max_streams`).
    pub max_streams: usize,
    /// Replay DEALERs open at once: `max_concurrent_replays`, lowered to fit.
    pub replays: usize,
    /// Whether `replays` is below `max_concurrent_replays`.
    pub replays_lowered: bool,
}

impl FdBudget {
    /// The plan for `limit` with `limits`, `http_connections` and streams of `kind`.
    pub fn plan(
        limit: Option<u64>,
        limits: &Limits,
        http_connections: u64,
        kind: StreamKind,
    ) -> FdBudget {
        let wanted = limits.max_concurrent_replays.max(1);
        let streams = limits.max_streams as u64 * kind.fds();
        let fit = match limit {
            None => wanted.saturating_mul(4),
            Some(limit) => {
                let left = limit.saturating_sub(RESERVED_FDS + http_connections + streams);
                usize::try_from(left / REPLAY_FDS).unwrap_or(usize::MAX)
            }
        };
        let replays = fit.clamp(1, wanted);
        FdBudget {
            limit,
            http_connections,
            kind,
            replay_sockets: fit.max(replays),
            max_streams: limits.max_streams,
            replays,
            replays_lowered: replays < wanted,
        }
    }

    /// Descriptors left for streams and replays (`None`: unlimited).
    fn for_streams(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(RESERVED_FDS + self.http_connections))
    }

    /// Streams of `kind` the limit holds beside `replays` open replays (`None`: unlimited).
    pub fn streams_allowed(&self, kind: StreamKind) -> Option<u64> {
        let left = self.for_streams()?.saturating_sub(self.replays as u64 * REPLAY_FDS);
        Some(left / kind.fds())
    }

    /// The ZeroMQ context's socket limit (`ZMQ_MAX_SOCKETS`): the streams' sockets, the replay
    /// DEALERs the descriptors hold ([`FdBudget::replay_sockets`]) and [`SPARE_SOCKETS`].
    pub fn zmq_sockets(&self) -> usize {
        let per_stream = match self.kind {
            StreamKind::Connected => CONNECTED_STREAM_SOCKETS,
            StreamKind::Bound => 0,
        };
        self.max_streams
            .saturating_mul(per_stream)
            .saturating_add(self.replay_sockets)
            .saturating_add(SPARE_SOCKETS)
    }

    /// Whether `max_streams` streams of the budget's kind fit.
    pub fn fits(&self) -> bool {
        self.streams_allowed(self.kind).is_none_or(|n| n >= self.max_streams as u64)
    }

    /// The start-up line: what the limit allows.
    pub fn describe(&self) -> String {
        let Some(limit) = self.limit else {
            return format!(
                "the open-file limit is unlimited: max_streams = {} streams and {} concurrent \
                 replays fit",
                self.max_streams, self.replays
            );
        };
        let allowed = |k: StreamKind| self.streams_allowed(k).unwrap_or(u64::MAX);
        format!(
            "the open-file limit {limit} allows {} streams kvdir connects to ({CONNECTED_STREAM_FDS} \
             descriptors each) or {} on the bind endpoint ({BOUND_STREAM_FDS} each), beside {} \
             concurrent replays ({REPLAY_FDS} each), {} HTTP connections and {RESERVED_FDS} \
             reserved",
            allowed(StreamKind::Connected),
            allowed(StreamKind::Bound),
            self.replays,
            self.http_connections
        )
    }

    /// The problems an operator should hear of at start, each with its fix.
    pub fn warnings(&self, max_concurrent_replays: usize) -> Vec<String> {
        let mut out = Vec::new();
        let Some(limit) = self.limit else { return out };
        if self.replays_lowered {
            out.push(format!(
                "max_concurrent_replays = {max_concurrent_replays} does not fit the open-file \
                 limit {limit} beside max_streams = {} streams: at most {} replays run at once \
                 (the others wait their turn); raise the limit (ulimit -n) or lower max_streams",
                self.max_streams, self.replays
            ));
        }
        if !self.fits() {
            let need = RESERVED_FDS
                + self.http_connections
                + self.max_streams as u64 * self.kind.fds()
                + self.replays as u64 * REPLAY_FDS;
            out.push(format!(
                "max_streams = {} needs about {need} file descriptors, above the open-file limit \
                 {limit}: about {} streams fit; streams beyond them wait for a descriptor. Raise \
                 the limit (ulimit -n {need}), lower --http_max_connections, or run fewer \
                 streams",
                self.max_streams,
                self.streams_allowed(self.kind).unwrap_or(0)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_streams: usize, max_concurrent_replays: usize) -> Limits {
        Limits { max_streams, max_concurrent_replays, ..Limits::default() }
    }

    #[test]
    fn a_generous_limit_keeps_every_replay_slot() {
        let b = FdBudget::plan(Some(1 << 20), &limits(4096, 256), 4096, StreamKind::Connected);
        assert_eq!((b.replays, b.replays_lowered, b.fits()), (256, false, true));
        assert!(b.warnings(256).is_empty());
        assert_eq!(FdBudget::plan(None, &limits(4096, 256), 4096, StreamKind::Bound).replays, 256);
    }

    #[test]
    fn replays_are_lowered_to_what_is_left_beside_the_streams() {
        // 20,000 - 256 reserved - 4,096 HTTP - 4,096 x 4 connected = -736: one replay, and
        // 3,911 connected streams fit; bound, 4,096 x 1 leaves 11,552: 5,776 replays.
        let b = FdBudget::plan(Some(20_000), &limits(4096, 8192), 4096, StreamKind::Connected);
        assert_eq!((b.replays, b.replays_lowered, b.fits()), (1, true, false));
        assert_eq!(b.streams_allowed(StreamKind::Connected), Some(3911));
        let b = FdBudget::plan(Some(20_000), &limits(4096, 8192), 4096, StreamKind::Bound);
        assert_eq!((b.replays, b.replays_lowered, b.fits()), (5776, true, true));
        assert_eq!(b.zmq_sockets(), 5776 + SPARE_SOCKETS, "no socket of their own");
        assert!(b.warnings(8192)[0].contains("at most 5776 replays run at once"));
        assert_eq!(b.streams_allowed(StreamKind::Bound), Some(4096));
    }

    #[test]
    fn a_limit_too_low_for_the_streams_says_how_many_fit() {
        // 1,024 - 256 - 100 = 668: one replay (2) leaves 666, 166 connected streams.
        let b = FdBudget::plan(Some(1024), &limits(300, 256), 100, StreamKind::Connected);
        assert_eq!((b.replays, b.fits()), (1, false));
        assert_eq!(b.streams_allowed(StreamKind::Connected), Some(166));
        assert_eq!(b.streams_allowed(StreamKind::Bound), Some(666));
        let w = b.warnings(256);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[1].contains("about 166 streams fit") && w[1].contains("ulimit -n"), "{w:?}");
        assert!(b.describe().contains("allows 166 streams kvdir connects to"), "{}", b.describe());
    }

    #[test]
    fn closing_dealers_may_use_every_descriptor_left_and_no_more() {
        // Issue 36, run C: 20,000 - 256 - 1,024 HTTP - 4,096 x 4 = 2,336 left: 256 replays
        // open at once, 1,168 DEALERs open or closing, each with its 2 descriptors.
        let b = FdBudget::plan(Some(20_000), &limits(4096, 256), 1024, StreamKind::Connected);
        assert_eq!((b.replays, b.replay_sockets), (256, 1168));
        assert_eq!(b.zmq_sockets(), 4096 * 3 + 1168 + SPARE_SOCKETS);
        let fds = 4096 * CONNECTED_STREAM_FDS + 1168 * REPLAY_FDS + RESERVED_FDS + 1024;
        assert!(fds <= 20_000, "{fds}");
        // Too few descriptors for the streams: the one replay still gets its socket.
        let b = FdBudget::plan(Some(1024), &limits(300, 256), 100, StreamKind::Connected);
        assert_eq!((b.replays, b.replay_sockets), (1, 1));
        let b = FdBudget::plan(None, &limits(300, 256), 100, StreamKind::Connected);
        assert_eq!((b.replays, b.replay_sockets), (256, 1024), "unlimited: room to close");
    }
}
