//! The bind endpoint (`kv_events_bind`): a port per rank (rank r on `port + r`), each owned by
//! one of the I/O threads, which hands each message to its stream: kvdir's own listener and
//! ZMTP reader at an IP address (`pool/listen.rs`), a libzmq SUB socket bound on an interface
//! or host name.
//!
//! Engines connect their PUB sockets to kvdir; their messages carry the engine's topic. The
//! route table ([`BindRoutes`], kept by the stream set as bound streams start and stop) maps
//! `(topic, rank)` to the stream's key, the 16 hex digits its keyed topic starts with. Rank r's
//! port lives on I/O thread `r % threads`, and every bound stream of rank r is pinned to that
//! thread, so the thread that reads a message is the one that owns its stream: it looks the
//! key up and hands the message to the stream in place (`pool/ports.rs`), with no other thread,
//! copy or socket per stream in between. A message whose topic (on that port) names no running stream
//! is counted and logged once per topic, or announces its engine (`kv_events_bind.announce`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use kvdir::config::announce::Announced;
use kvdir::config::{keyed_topic, BindConfig, Limits};
use serde::Serialize;

use super::pool::{IoPool, Listener, PortSocket};
use super::sockets::{max_frame, ZmqContext};
use crate::sync::{lock, read, write};

/// Receive high-water mark of a bound port, in messages per connected engine.
const HWM: i32 = 100_000;
/// Distinct unknown topics logged (then one line says the rest are not) and reported.
const MAX_LOGGED_TOPICS: usize = 1024;
const MAX_REPORTED_TOPICS: usize = 16;

/// `(topic, rank) -> keyed topic` of the running bound streams, and the receiver's counters.
#[derive(Clone)]
pub struct BindRoutes(Arc<Routes>);

/// Engine topic -> rank -> the key of its stream.
type Table = HashMap<Vec<u8>, HashMap<u32, u64>>;

struct Routes {
    config: BindConfig,
    table: RwLock<Table>,
    /// Bumped by every change of the table (a reader's cached route is good while it holds).
    version: AtomicU64,
    next_key: AtomicU64,
    messages: AtomicU64,
    unknown: AtomicU64,
    /// Engine connections open on the ports kvdir listens on.
    connections: AtomicU64,
    unknown_topics: Mutex<BTreeSet<String>>,
    /// Unknown `(topic, rank)` pairs logged so far.
    logged: Mutex<HashSet<(Vec<u8>, u32)>>,
    /// Engines that announced themselves (`kv_events_bind.announce`), for discovery to list,
    /// and every topic announced so far (announced once, until discovery drops the engine).
    announced: Mutex<Announcements>,
}

/// Announced engines waiting for discovery, and every topic announced so far.
#[derive(Default)]
struct Announcements {
    queued: Vec<(String, Announced)>,
    topics: HashSet<String>,
}

/// What `/v1/internal/streams` and `/metrics` show of the bind endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct BindReport {
    /// The bound endpoint of each rank.
    pub endpoints: Vec<String>,
    /// The topic pattern.
    pub topic: String,
    /// Messages handed to a stream.
    pub messages: u64,
    /// Messages whose topic, on their port, names no running stream.
    pub unknown_messages: u64,
    /// Some of those topics (`topic (rank r)`), at most 16.
    pub unknown_topics: Vec<String>,
    /// Engine connections open on the ports kvdir listens on (a libzmq port's, bound on an
    /// interface name, are not counted).
    pub connections: u64,
}

impl BindRoutes {
    /// An empty table for `config`.
    pub fn new(config: BindConfig) -> Self {
        BindRoutes(Arc::new(Routes {
            config,
            table: RwLock::default(),
            version: AtomicU64::new(0),
            next_key: AtomicU64::new(1),
            messages: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            unknown_topics: Mutex::default(),
            logged: Mutex::default(),
            announced: Mutex::default(),
        }))
    }

    /// The bind settings.
    pub fn config(&self) -> &BindConfig {
        &self.0.config
    }

    /// Whether a stream receives `topic` on rank `rank`'s port.
    pub fn contains(&self, topic: &str, rank: u32) -> bool {
        read(&self.0.table).get(topic.as_bytes()).is_some_and(|r| r.contains_key(&rank))
    }

    /// Routes `topic` on rank `rank`'s port to a new key; returns the keyed topic the stream
    /// subscribes to, or `Err` when the rank has no port or the pair is routed already.
    pub fn add(&self, topic: &str, rank: u32) -> Result<String, String> {
        if rank >= self.0.config.ranks {
            return Err(format!(
                "dp_rank {rank} has no bound port: kv_events_bind.ranks = {}; raise ranks",
                self.0.config.ranks
            ));
        }
        let mut table = write(&self.0.table);
        let ranks = table.entry(topic.as_bytes().to_vec()).or_default();
        if ranks.contains_key(&rank) {
            return Err(format!("topic {topic:?} dp_rank {rank} has a stream already"));
        }
        let key = self.0.next_key.fetch_add(1, Ordering::Relaxed);
        ranks.insert(rank, key);
        self.0.version.fetch_add(1, Ordering::Release);
        Ok(keyed_topic(key, topic))
    }

    /// Stops routing `topic` on rank `rank`'s port: its messages become unknown.
    pub fn remove(&self, topic: &str, rank: u32) {
        let mut table = write(&self.0.table);
        self.0.version.fetch_add(1, Ordering::Release);
        if let Some(ranks) = table.get_mut(topic.as_bytes()) {
            ranks.remove(&rank);
            if ranks.is_empty() {
                table.remove(topic.as_bytes());
            }
        }
    }

    /// The engines announced since the last call, with their topics.
    pub fn take_announced(&self) -> Vec<(String, Announced)> {
        std::mem::take(&mut lock(&self.0.announced).queued)
    }

    /// Forgets that `topic` was announced: a message under it announces its engine again.
    pub fn forget_announced(&self, topic: &str) {
        lock(&self.0.announced).topics.remove(topic);
    }

    /// Queues the engine `topic` announces, once, when announcing is on and its address allowed;
    /// whether it is one.
    fn announce(&self, topic: &[u8]) -> bool {
        let Some(config) = &self.0.config.announce else { return false };
        let Ok(topic) = std::str::from_utf8(topic) else { return false };
        let Some(engine) = config.engine(topic) else { return false };
        let mut announced = lock(&self.0.announced);
        if announced.topics.insert(topic.to_string()) {
            tracing::info!(%topic, engine = %engine.host(), "an engine announced itself");
            announced.queued.push((topic.to_string(), engine));
        }
        true
    }

    /// The table's version: a route looked up after reading it stays good while it is
    /// unchanged (read without the table's lock, which every port's thread would contend).
    pub(super) fn version(&self) -> u64 {
        self.0.version.load(Ordering::Acquire)
    }

    /// The key of the stream of `topic` on rank `rank`'s port.
    pub(super) fn lookup(&self, topic: &[u8], rank: u32) -> Option<u64> {
        read(&self.0.table).get(topic).and_then(|r| r.get(&rank)).copied()
    }

    /// Counts `n` messages a port's burst handed to streams (once a burst, not a message).
    pub(super) fn handed(&self, n: u64) {
        if n > 0 {
            self.0.messages.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A message on rank `rank`'s port whose topic names no running stream: counted, and
    /// logged once per topic, unless it announces its engine.
    pub(super) fn unknown(&self, topic: &[u8], rank: u32) {
        self.0.unknown.fetch_add(1, Ordering::Relaxed);
        if self.announce(topic) {
            return; // its stream replays what was sent before it started
        }
        let mut logged = lock(&self.0.logged);
        let pair = (topic.to_vec(), rank);
        if logged.len() > MAX_LOGGED_TOPICS || logged.contains(&pair) {
            return;
        }
        let shown = format!("{:?} (rank {rank})", String::from_utf8_lossy(topic));
        if logged.len() == MAX_LOGGED_TOPICS {
            tracing::warn!("more unknown topics on kv_events_bind; they are counted, not logged");
        } else {
            tracing::warn!(
                topic = %shown,
                "a message on kv_events_bind names no known engine: list or register the \
                 engine with \"events\": \"bind\" and this topic; counted as unknown"
            );
            let mut reported = lock(&self.0.unknown_topics);
            if reported.len() < MAX_REPORTED_TOPICS {
                reported.insert(shown);
            }
        }
        logged.insert(pair);
    }

    /// An engine's connection to a port kvdir listens on opened (`true`) or closed.
    pub(super) fn connection(&self, opened: bool) {
        match opened {
            true => self.0.connections.fetch_add(1, Ordering::Relaxed),
            false => self.0.connections.fetch_sub(1, Ordering::Relaxed),
        };
    }

    /// The counters and settings, for reports.
    pub fn report(&self) -> BindReport {
        BindReport {
            endpoints: self.0.config.endpoints(),
            topic: self.0.config.topic.as_str().to_string(),
            messages: self.0.messages.load(Ordering::Relaxed),
            unknown_messages: self.0.unknown.load(Ordering::Relaxed),
            unknown_topics: lock(&self.0.unknown_topics).iter().cloned().collect(),
            connections: self.0.connections.load(Ordering::Relaxed),
        }
    }

    /// How a bound stream's live endpoint is shown: its rank's port and its topic.
    pub fn describe(&self, topic: &str, rank: u32) -> String {
        format!("bind {} topic {topic:?}", self.0.config.rank_endpoint(rank))
    }
}

/// Binds every rank's port and hands rank r's to I/O thread `r % threads` of `pool`, which
/// reads it from then on (the ports close with the threads): kvdir's own listener at an IP
/// address (or `*`), a libzmq SUB socket for an interface or host name. `Err` names the
/// endpoint that could not be bound.
pub fn bind_ports(
    zmq: &ZmqContext,
    pool: &IoPool,
    routes: BindRoutes,
    limits: &Limits,
) -> Result<(), String> {
    let mut ports = Vec::new();
    for ep in routes.config().endpoints() {
        let port = bind_port(zmq, &ep, limits).map_err(|e| {
            format!("cannot bind kv_events_bind {ep}: {e}; pick a free port (or fewer ranks)")
        })?;
        ports.push(port);
    }
    tracing::info!(endpoints = ?routes.config().endpoints(), "engines connect to kv_events_bind");
    for (rank, port) in ports.into_iter().enumerate() {
        pool.attach_port(rank as u32, port, routes.clone());
    }
    Ok(())
}

/// One rank's port.
fn bind_port(zmq: &ZmqContext, ep: &str, limits: &Limits) -> Result<PortSocket, String> {
    let max = max_frame(limits);
    if let Some(addr) = listen_addr(ep) {
        let listener = Listener::bind(addr, max as u64, limits.publisher_timeout);
        return listener.map(PortSocket::Tcp).map_err(|e| e.to_string());
    }
    let sub = zmq.socket(zmq::SUB).map_err(|e| e.to_string())?;
    let setup = sub
        .set_linger(0)
        .and_then(|()| sub.set_rcvhwm(HWM))
        .and_then(|()| sub.set_maxmsgsize(max))
        .and_then(|()| sub.set_subscribe(b""))
        .and_then(|()| sub.bind(ep));
    setup.map_err(|e| e.to_string())?;
    Ok(PortSocket::Zmq(sub))
}

/// The address kvdir listens on itself for `tcp://IP:PORT` (`*`: every IPv4 interface, as
/// libzmq binds it); `None` for an interface or host name.
fn listen_addr(ep: &str) -> Option<SocketAddr> {
    let (host, port) = ep.strip_prefix("tcp://")?.rsplit_once(':')?;
    let host = if host == "*" { "0.0.0.0" } else { host };
    format!("{host}:{port}").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::listen_addr;

    #[test]
    fn addresses_are_listened_on_by_kvdir_and_names_bound_by_libzmq() {
        let addr = |ep| listen_addr(ep).map(|a| a.to_string());
        assert_eq!(addr("tcp://*:5557").as_deref(), Some("0.0.0.0:5557"));
        assert_eq!(addr("tcp://127.0.0.1:9500").as_deref(), Some("127.0.0.1:9500"));
        assert_eq!(addr("tcp://[::1]:9500").as_deref(), Some("[::1]:9500"));
        assert_eq!(addr("tcp://eth0:5557"), None, "an interface");
        assert_eq!(addr("tcp://engine-0:5557"), None, "a host name");
    }
}
