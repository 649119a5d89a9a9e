//! The HTTP load: `--query_clients` threads send `POST /v1/internal/kv-cache/query` and
//! `--route_clients` threads `POST /v1/internal/route`, each over its own keep-alive
//! connection, back to back or at `--client_rate` requests per second (open loop: a late
//! request is sent at once, never in a burst). Client `i` walks the prompt pool from offset
//! `i`, so clients do not send the same prompt at the same moment.
//!
//! A request counts as served when kvdir answers 200; anything else is an error, keyed by
//! `HTTP <status>` or `transport: <what failed>`. Latency is measured from sending the request
//! to reading the last body byte.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::http::Conn;
use super::stages::Stages;
use super::BenchError;

/// Upper bound of one request (connect, write, read).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `POST /v1/internal/kv-cache/query`.
    Query,
    /// `POST /v1/internal/route`.
    Route,
}

impl Kind {
    /// The endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Kind::Query => "/v1/internal/kv-cache/query",
            Kind::Route => "/v1/internal/route",
        }
    }

    /// `query` or `route`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Query => "query",
            Kind::Route => "route",
        }
    }
}

/// What the clients of one kind saw.
#[derive(Debug, Clone, PartialEq)]
pub struct KindStats {
    /// The kind.
    pub kind: Kind,
    /// Latencies of served requests, sorted.
    pub latencies: Vec<Duration>,
    /// Failed requests by `HTTP <status>` or `transport: ...`.
    pub errors: BTreeMap<String, u64>,
    /// How long the clients ran.
    pub wall: Duration,
    /// Where the served requests' time went (kvdir's `Server-Timing`).
    pub stages: Stages,
}

impl KindStats {
    pub(crate) fn new(kind: Kind) -> KindStats {
        let (latencies, errors, wall) = (Vec::new(), BTreeMap::new(), Duration::ZERO);
        KindStats { kind, latencies, errors, wall, stages: Stages::default() }
    }

    pub(crate) fn merge(&mut self, other: KindStats) {
        self.latencies.extend(other.latencies);
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        self.wall = self.wall.max(other.wall);
        self.stages.merge(other.stages);
    }

    /// Served requests per second.
    pub fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Failed requests.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Nearest-rank percentile of the served requests' latency (zero when none).
    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    /// The slowest served request (zero when none).
    pub fn max(&self) -> Duration {
        self.latencies.last().copied().unwrap_or_default()
    }
}

/// Nearest-rank percentile `p` of `sorted` (zero when empty).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let n = sorted.len();
    if n == 0 {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Who sends what, and where.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// kvdir's HTTP address.
    pub addr: String,
    /// `X-Internal-Token`.
    pub token: Option<String>,
    /// Client threads per kind.
    pub clients: Vec<(Kind, u32)>,
    /// Requests per second per client; `None` = back to back.
    pub rate: Option<f64>,
}

/// Runs `during` while the clients run; they stop when it returns. Returns its result and one
/// [`KindStats`] per kind with at least one client.
pub fn with_clients<T>(
    plan: &ClientPlan,
    prompts: &[Vec<u8>],
    during: impl FnOnce() -> T,
) -> Result<(T, Vec<KindStats>), BenchError> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let mut handles = Vec::new();
        let mut index = 0;
        for &(kind, count) in &plan.clients {
            for _ in 0..count {
                let (stop, offset) = (&stop, index);
                index += 1;
                let builder =
                    thread::Builder::new().name(format!("bench-{}-{offset}", kind.name()));
                let handle = builder
                    .spawn_scoped(scope, move || client(plan, kind, prompts, offset, stop))
                    .map_err(|e| BenchError::Kvdir(format!("spawn a client: {e}")));
                handles.push(handle);
            }
        }
        let out = during();
        stop.store(true, Ordering::Release);
        let mut stats: Vec<KindStats> = Vec::new();
        for handle in handles {
            let s = handle?.join().map_err(|_| BenchError::Panicked("a client"))?;
            match stats.iter_mut().find(|k| k.kind == s.kind) {
                Some(k) => k.merge(s),
                None => stats.push(s),
            }
        }
        stats.iter_mut().for_each(|s| {
            s.latencies.sort();
            s.stages.sort();
        });
        stats.sort_by_key(|s| s.kind);
        Ok((out, stats))
    })
}

/// One client thread until `stop`.
fn client(
    plan: &ClientPlan,
    kind: Kind,
    prompts: &[Vec<u8>],
    offset: usize,
    stop: &AtomicBool,
) -> KindStats {
    let mut conn = Conn::new(&plan.addr, plan.token.clone(), REQUEST_TIMEOUT);
    let interval = plan.rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut stats = KindStats::new(kind);
    let start = Instant::now();
    let mut next = start;
    let mut k = offset;
    while !stop.load(Ordering::Acquire) {
        if let Some(interval) = interval {
            let now = Instant::now();
            if next > now {
                // Short naps so that a stop is seen within a millisecond.
                thread::sleep((next - now).min(Duration::from_millis(1)));
                continue;
            }
            next = next.max(now - interval) + interval;
        }
        let body = &prompts[k % prompts.len()];
        k += 1;
        let t0 = Instant::now();
        match conn.post(kind.path(), body) {
            Ok(reply) if reply.status == 200 => {
                let took = t0.elapsed();
                stats.latencies.push(took);
                if let Some(timing) = &reply.server_timing {
                    stats.stages.add(timing, took);
                }
            }
            Ok(reply) => *stats.errors.entry(format!("HTTP {}", reply.status)).or_default() += 1,
            Err(e) => *stats.errors.entry(format!("transport: {}", e.kind())).or_default() += 1,
        }
    }
    stats.wall = start.elapsed();
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_ordered() {
        let mut s = KindStats::new(Kind::Query);
        assert_eq!((s.percentile(50.0), s.max()), (Duration::ZERO, Duration::ZERO));
        s.latencies = (1..=100).map(Duration::from_millis).collect();
        s.wall = Duration::from_secs(2);
        assert_eq!(s.percentile(50.0), Duration::from_millis(50));
        assert_eq!(s.percentile(99.0), Duration::from_millis(99));
        assert_eq!(s.max(), Duration::from_millis(100));
        assert_eq!(s.per_second(), 50.0);
    }

    /// A port bound but not listening, held: connections to it are refused, and no other
    /// process can bind it meanwhile.
    fn dead_port() -> (rustix::fd::OwnedFd, std::net::SocketAddrV4) {
        use rustix::net::{bind, getsockname, socket, AddressFamily, SocketType};
        let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        bind(&fd, &std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = getsockname(&fd).unwrap().try_into().unwrap();
        (fd, addr)
    }

    #[test]
    fn a_dead_server_gives_transport_errors_not_latencies() {
        let (_held, addr) = dead_port();
        let plan = ClientPlan {
            addr: addr.to_string(),
            token: None,
            clients: vec![(Kind::Route, 1)],
            rate: Some(200.0),
        };
        // Clients for 50 ms at a time until one request went out (a loaded machine may not
        // run the client thread in the first window).
        let give_up = Instant::now() + Duration::from_secs(20);
        let stats = loop {
            let window = Instant::now() + Duration::from_millis(50);
            let ((), stats) = with_clients(&plan, &[b"{}".to_vec()], || {
                while Instant::now() < window {
                    thread::yield_now();
                }
            })
            .unwrap();
            let sent = stats[0].error_count() + stats[0].latencies.len() as u64;
            if sent > 0 || Instant::now() > give_up {
                break stats;
            }
        };
        assert_eq!(stats.len(), 1);
        assert!(stats[0].latencies.is_empty());
        assert!(stats[0].errors.keys().all(|k| k.starts_with("transport: ")), "{stats:?}");
        assert!(stats[0].error_count() > 0);
    }
}
