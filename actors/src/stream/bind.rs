//! The bind receiver: one thread that owns the SUB socket of every bound port (`kv_events_bind`,
//! rank r on `port + r`) and hands each message to its stream.
//!
//! Engines connect their PUB sockets to kvdir; their messages carry the engine's topic. The
//! thread looks up `(topic, rank)` in the route table ([`BindRoutes`], kept by the stream set as
//! bound streams start and stop) and re-publishes the message on one in-process PUB socket
//! ([`BIND_ENDPOINT`]) with the topic frame replaced by the stream's keyed topic (16 hex digits
//! of a stream id, then the engine's topic: fixed-width keys make subscriptions prefix-free).
//! Sequence and payload frames pass unchanged. A bound stream is then an ordinary stream
//! subscribed to its keyed topic on the in-process socket. A message whose topic (on that port)
//! names no running stream is counted and logged once per topic.
//!
//! The thread sleeps in `zmq_poll` over its sockets and a stop socket, reads what is ready
//! before it sleeps again, and ends when the [`BindReceiver`] is dropped.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use kvdir::config::announce::Announced;
use kvdir::config::{keyed_topic, BindConfig, Limits, BIND_ENDPOINT};
use serde::Serialize;

use super::sockets::{max_frame, Socket, ZmqContext};
use crate::sync::{lock, read, write};

/// Receive (bound ports) and send (in-process) high-water marks, in messages.
const HWM: i32 = 100_000;
/// Messages read from one port before the others are looked at again.
const BURST: usize = 1024;
/// Distinct unknown topics logged (then one line says the rest are not) and reported.
const MAX_LOGGED_TOPICS: usize = 1024;
const MAX_REPORTED_TOPICS: usize = 16;
/// The stop socket's in-process endpoint.
const STOP_ENDPOINT: &str = "inproc://kvdir-bind-stop";

/// `(topic, rank) -> keyed topic` of the running bound streams, and the receiver's counters.
#[derive(Clone)]
pub struct BindRoutes(Arc<Routes>);

/// Engine topic -> rank -> the keyed topic of its stream.
type Table = HashMap<Vec<u8>, HashMap<u32, Vec<u8>>>;

struct Routes {
    config: BindConfig,
    table: RwLock<Table>,
    next_key: AtomicU64,
    messages: AtomicU64,
    unknown: AtomicU64,
    unknown_topics: Mutex<BTreeSet<String>>,
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
}

impl BindRoutes {
    /// An empty table for `config`.
    pub fn new(config: BindConfig) -> Self {
        BindRoutes(Arc::new(Routes {
            config,
            table: RwLock::default(),
            next_key: AtomicU64::new(1),
            messages: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            unknown_topics: Mutex::default(),
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
        let keyed = keyed_topic(self.0.next_key.fetch_add(1, Ordering::Relaxed), topic);
        ranks.insert(rank, keyed.clone().into_bytes());
        Ok(keyed)
    }

    /// Stops routing `topic` on rank `rank`'s port: its messages become unknown.
    pub fn remove(&self, topic: &str, rank: u32) {
        let mut table = write(&self.0.table);
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

    /// The keyed topic of `topic` on rank `rank`'s port.
    fn lookup(&self, topic: &[u8], rank: u32) -> Option<Vec<u8>> {
        read(&self.0.table).get(topic).and_then(|r| r.get(&rank)).cloned()
    }

    /// The counters and settings, for reports.
    pub fn report(&self) -> BindReport {
        BindReport {
            endpoints: self.0.config.endpoints(),
            topic: self.0.config.topic.as_str().to_string(),
            messages: self.0.messages.load(Ordering::Relaxed),
            unknown_messages: self.0.unknown.load(Ordering::Relaxed),
            unknown_topics: lock(&self.0.unknown_topics).iter().cloned().collect(),
        }
    }

    /// How a bound stream's live endpoint is shown: its rank's port and its topic.
    pub fn describe(&self, topic: &str, rank: u32) -> String {
        format!("bind {} topic {topic:?}", self.0.config.rank_endpoint(rank))
    }
}

/// The running receiver; dropping it stops the thread and waits for it.
pub struct BindReceiver {
    stop: Socket,
    thread: Option<JoinHandle<()>>,
}

impl BindReceiver {
    /// Binds the in-process PUB socket and every rank's SUB socket on `zmq` (before any stream
    /// connects), then starts the thread. `Err` names the endpoint that could not be bound.
    pub fn start(zmq: &ZmqContext, routes: BindRoutes, limits: &Limits) -> Result<Self, String> {
        let fail = |what: &str, e: zmq::Error| format!("cannot bind {what}: {e}");
        let publ = zmq.socket(zmq::PUB).map_err(|e| fail(BIND_ENDPOINT, e))?;
        publ.set_linger(0).and_then(|()| publ.set_sndhwm(HWM)).map_err(|e| fail("", e))?;
        publ.bind(BIND_ENDPOINT).map_err(|e| fail(BIND_ENDPOINT, e))?;
        let max = max_frame(limits);
        let mut subs = Vec::new();
        for ep in routes.config().endpoints() {
            let sub = zmq.socket(zmq::SUB).map_err(|e| fail(&ep, e))?;
            let setup = sub
                .set_linger(0)
                .and_then(|()| sub.set_rcvhwm(HWM))
                .and_then(|()| sub.set_maxmsgsize(max))
                .and_then(|()| sub.set_subscribe(b""))
                .and_then(|()| sub.bind(&ep));
            setup.map_err(|e| {
                format!("cannot bind kv_events_bind {ep}: {e}; pick a free port (or fewer ranks)")
            })?;
            subs.push(sub);
        }
        let listen = zmq.socket(zmq::PAIR).map_err(|e| fail(STOP_ENDPOINT, e))?;
        listen.bind(STOP_ENDPOINT).map_err(|e| fail(STOP_ENDPOINT, e))?;
        let stop = zmq.socket(zmq::PAIR).map_err(|e| fail(STOP_ENDPOINT, e))?;
        stop.set_linger(0).and_then(|()| stop.connect(STOP_ENDPOINT)).map_err(|e| fail("", e))?;
        tracing::info!(endpoints = ?routes.config().endpoints(), "engines connect to kv_events_bind");
        let mut r = Receiver { subs, publ, listen, routes, logged: HashSet::new() };
        let thread = std::thread::Builder::new()
            .name("kvdir-bind".into())
            .spawn(move || r.run())
            .map_err(|e| format!("cannot start the bind thread: {e}"))?;
        Ok(BindReceiver { stop, thread: Some(thread) })
    }
}

impl Drop for BindReceiver {
    fn drop(&mut self) {
        // Not blocking: a thread that already ended (its poll failed) has no peer socket left.
        let _ = self.stop.send(&b""[..], zmq::DONTWAIT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's sockets and state.
struct Receiver {
    subs: Vec<Socket>,
    publ: Socket,
    listen: Socket,
    routes: BindRoutes,
    /// Unknown `(topic, rank)` pairs logged so far.
    logged: HashSet<(Vec<u8>, u32)>,
}

impl Receiver {
    fn run(&mut self) {
        loop {
            let ready: Vec<usize> = {
                let mut items: Vec<zmq::PollItem<'_>> =
                    self.subs.iter().map(|s| s.as_poll_item(zmq::POLLIN)).collect();
                items.push(self.listen.as_poll_item(zmq::POLLIN));
                match zmq::poll(&mut items, -1) {
                    Ok(_) => {}
                    Err(zmq::Error::EINTR) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "bind receiver: poll failed; it stops");
                        return;
                    }
                }
                if items.last().is_some_and(|i| i.is_readable()) {
                    return;
                }
                (0..self.subs.len()).filter(|&i| items[i].is_readable()).collect()
            };
            for rank in ready {
                self.drain(rank);
            }
        }
    }

    /// Reads up to [`BURST`] messages of one port.
    fn drain(&mut self, rank: usize) {
        for _ in 0..BURST {
            match self.subs[rank].recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => self.forward(frames, rank as u32),
                Err(zmq::Error::EAGAIN) => return,
                Err(e) => {
                    tracing::warn!(error = %e, rank, "bind receiver: cannot read a message");
                    return;
                }
            }
        }
    }

    /// Re-publishes one message under its stream's keyed topic, or counts it as unknown.
    fn forward(&mut self, mut frames: Vec<Vec<u8>>, rank: u32) {
        let Some(topic) = frames.first() else { return };
        let Some(keyed) = self.routes.lookup(topic, rank) else {
            self.unknown(rank, frames.swap_remove(0));
            return;
        };
        frames[0] = keyed;
        // A full queue drops the message, like a SUB socket beyond its high-water mark: the
        // stream sees a gap in the sequence numbers and recovers.
        match self.publ.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) | Err(zmq::Error::EAGAIN) => {}
            Err(e) => tracing::warn!(error = %e, "bind receiver: cannot hand a message on"),
        }
        self.routes.0.messages.fetch_add(1, Ordering::Relaxed);
    }

    fn unknown(&mut self, rank: u32, topic: Vec<u8>) {
        self.routes.0.unknown.fetch_add(1, Ordering::Relaxed);
        if self.routes.announce(&topic) {
            return; // its stream replays what was sent before it started
        }
        if self.logged.len() > MAX_LOGGED_TOPICS || self.logged.contains(&(topic.clone(), rank)) {
            return;
        }
        let shown = format!("{:?} (rank {rank})", String::from_utf8_lossy(&topic));
        if self.logged.len() == MAX_LOGGED_TOPICS {
            tracing::warn!("more unknown topics on kv_events_bind; they are counted, not logged");
        } else {
            tracing::warn!(
                topic = %shown,
                "a message on kv_events_bind names no known engine: list or register the \
                 engine with \"events\": \"bind\" and this topic; counted as unknown"
            );
            let mut reported = lock(&self.routes.0.unknown_topics);
            if reported.len() < MAX_REPORTED_TOPICS {
                reported.insert(shown);
            }
        }
        self.logged.insert((topic, rank));
    }
}
