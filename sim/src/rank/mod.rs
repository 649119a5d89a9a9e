//! One DP rank of a simulated engine: the state a rank thread of [`crate::pool`] owns for it:
//! the rank's PUB and ROUTER sockets (ZeroMQ sockets are not `Sync`), its cache model, its
//! sequence counter and its faults.
//!
//! The thread runs jobs sent by [`crate::SimEngine`] (each job answers on its own channel) and,
//! whenever the ROUTER signals, serves replay requests: xLLM snapshots (`snapshot`) or, in the
//! vLLM dialect, the buffered history of batches (`history`). Because one thread both
//! publishes and answers replays for a rank, a reply always reflects exactly the batches
//! published before it.
//!
//! The PUB binds the rank's event port, or with [`EngineConfig::events_connect`] connects to
//! the subscriber's port for the rank (vLLM's publisher with a non-wildcard endpoint).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvdir::wire::record::{BatchRecord, EventRecord, ExtraKey, StoredRecord};
use kvdir::wire::{encode_batch, encode_live, Tier};
use tracing::debug;

use crate::cache::{CacheConfig, CacheEvent, CacheModel};
use crate::config::EventSide;
use crate::engine::Published;
use crate::fault::{Fault, FaultState};
use crate::process::ProcessStart;
use crate::{Dialect, EngineConfig, RankEndpoints, SimError};

mod history;
mod snapshot;

/// Work for a rank thread; it answers through a channel captured by the closure.
pub(crate) type Job = Box<dyn FnOnce(&mut RankState) + Send>;

/// How long a restart keeps retrying to re-bind ports the closed sockets still hold.
const REBIND_DEADLINE: Duration = Duration::from_secs(5);
/// PUB high-water mark: well above libzmq's 1000 so bursts from tests and benches are not
/// dropped, yet bounded (a PUB over its mark drops silently, like a real engine).
const SEND_HWM: i32 = 100_000;

/// A rank's two bound sockets.
pub(crate) struct Sockets {
    publisher: zmq::Socket,
    router: zmq::Socket,
}

impl Sockets {
    /// Binds (or connects) the PUB at `event` and binds the ROUTER at `replay`; returns the
    /// connectable endpoints (for a connecting PUB, the endpoint it connects to).
    pub(crate) fn bind(
        ctx: &zmq::Context,
        rank: u32,
        event: &EventSide,
        replay: &str,
    ) -> Result<(Sockets, RankEndpoints), SimError> {
        let publisher = open(ctx, zmq::PUB, rank)?;
        publisher.set_sndhwm(SEND_HWM).map_err(zmq_err(rank, "set_sndhwm"))?;
        let event = match event {
            EventSide::Bind(address) => bind(&publisher, rank, address)?,
            EventSide::Connect(address) => {
                publisher
                    .connect(address)
                    .map_err(|source| SimError::Connect { endpoint: address.clone(), source })?;
                address.clone()
            }
        };
        let router = open(ctx, zmq::ROUTER, rank)?;
        let replay = bind(&router, rank, replay)?;
        Ok((Sockets { publisher, router }, RankEndpoints { event, replay }))
    }

    /// Binds again at the endpoints of a previous incarnation (a connecting PUB connects
    /// again). Closing a ZeroMQ socket releases its port asynchronously, so "address in use"
    /// is retried until [`REBIND_DEADLINE`].
    fn rebind(
        ctx: &zmq::Context,
        rank: u32,
        config: &EngineConfig,
        at: &RankEndpoints,
    ) -> Result<Sockets, SimError> {
        let deadline = Instant::now() + REBIND_DEADLINE;
        let event = match config.events_connect {
            Some(_) => EventSide::Connect(at.event.clone()),
            None => EventSide::Bind(at.event.clone()),
        };
        loop {
            match Sockets::bind(ctx, rank, &event, &at.replay) {
                Ok((sockets, _)) => return Ok(sockets),
                Err(SimError::Bind { source: zmq::Error::EADDRINUSE, .. })
                    if Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn zmq_err(rank: u32, op: &'static str) -> impl Fn(zmq::Error) -> SimError {
    move |source| SimError::Zmq { rank, op, source }
}

fn open(ctx: &zmq::Context, kind: zmq::SocketType, rank: u32) -> Result<zmq::Socket, SimError> {
    let socket = ctx.socket(kind).map_err(zmq_err(rank, "socket"))?;
    socket.set_linger(0).map_err(zmq_err(rank, "set_linger"))?;
    Ok(socket)
}

fn bind(socket: &zmq::Socket, rank: u32, address: &str) -> Result<String, SimError> {
    socket
        .bind(address)
        .map_err(|source| SimError::Bind { endpoint: address.to_string(), source })?;
    match socket.get_last_endpoint() {
        Ok(Ok(endpoint)) => Ok(endpoint),
        Ok(Err(_)) => {
            Err(SimError::Zmq { rank, op: "get_last_endpoint", source: zmq::Error::EINVAL })
        }
        Err(source) => Err(SimError::Zmq { rank, op: "get_last_endpoint", source }),
    }
}

/// Everything one rank thread owns.
pub(crate) struct RankState {
    rank: u32,
    config: Arc<EngineConfig>,
    ctx: zmq::Context,
    /// Holds the rank's room in its context ([`crate::pool::context`]).
    _room: Arc<()>,
    endpoints: RankEndpoints,
    sockets: Option<Sockets>,
    /// Counts the sockets' incarnations: a restart's new ROUTER may reuse the old fd number.
    incarnation: u64,
    cache: CacheModel,
    next_seq: u64,
    faults: FaultState,
    published: Published,
    /// vLLM dialect: the latest `buffer_steps` batches as `(seq, payload)`, oldest first.
    history: VecDeque<(u64, Vec<u8>)>,
    /// The engine process's start time, moved forward by `restart`.
    started: Arc<ProcessStart>,
}

impl RankState {
    pub(crate) fn new(
        rank: u32,
        config: Arc<EngineConfig>,
        (ctx, room): (zmq::Context, Arc<()>),
        (sockets, endpoints): (Sockets, RankEndpoints),
        started: Arc<ProcessStart>,
    ) -> Self {
        let cache = CacheModel::new(cache_config(&config));
        let faults = FaultState::default();
        RankState {
            rank,
            config,
            ctx,
            _room: room,
            endpoints,
            sockets: Some(sockets),
            incarnation: 0,
            cache,
            next_seq: 0,
            faults,
            published: Published::default(),
            history: VecDeque::new(),
            started,
        }
    }

    /// The rank number.
    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    /// The engine's name, for logs.
    pub(crate) fn engine(&self) -> &str {
        &self.config.name
    }

    /// Which incarnation of the sockets the rank has (a restart makes a new one).
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The ROUTER's `ZMQ_FD`, which signals (edge-triggered) when its state may have changed;
    /// `None` without sockets.
    pub(crate) fn router_fd(&self) -> Option<RawFd> {
        self.sockets.as_ref().and_then(|s| s.router.get_fd().ok())
    }

    /// Whether the ROUTER has input (`ZMQ_EVENTS`, which also re-arms its fd).
    pub(crate) fn router_readable(&self) -> bool {
        let events = self.sockets.as_ref().and_then(|s| s.router.get_events().ok());
        events.is_some_and(|e| e.contains(zmq::POLLIN))
    }

    pub(crate) fn process(
        &mut self,
        tokens: &[i32],
        salt: Option<&str>,
    ) -> Result<Option<u64>, SimError> {
        self.change(|cache| cache.process_salted(tokens, salt))
    }

    pub(crate) fn offload(&mut self, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        if !self.cache.host_enabled() {
            return Err(SimError::HostDisabled { rank: self.rank });
        }
        self.change(|cache| cache.offload(tokens))
    }

    pub(crate) fn evict(&mut self, tokens: &[i32], tier: Tier) -> Result<Option<u64>, SimError> {
        self.change(|cache| cache.evict(tokens, tier))
    }

    pub(crate) fn store_copy(&mut self, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        self.change(|cache| cache.store_copy(tokens))
    }

    pub(crate) fn remove_copy(&mut self, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        self.change(|cache| cache.remove_copy(tokens))
    }

    pub(crate) fn clear(&mut self) -> Result<Option<u64>, SimError> {
        self.change(CacheModel::clear)
    }

    /// A request-driven change: `f` changes the cache and its events are published as one
    /// batch; while `Quiet`, nothing happens.
    fn change(
        &mut self,
        f: impl FnOnce(&mut CacheModel) -> Vec<CacheEvent>,
    ) -> Result<Option<u64>, SimError> {
        if self.faults.quiet() {
            return Ok(None);
        }
        let events = f(&mut self.cache);
        self.publish(events)
    }

    /// One live full-state batch. Not gated by `Quiet`: it is a deliberate test action, not a
    /// request.
    pub(crate) fn publish_full_state(&mut self) -> Result<u64, SimError> {
        let mut events = vec![CacheEvent::Cleared];
        events.extend(self.cache.full_state());
        self.publish_batch(events)
    }

    /// The publisher process restarts: sockets closed and bound again at the same endpoints,
    /// sequence back to 0, cache and replay history empty, a new process start time. Faults
    /// are harness settings and are kept.
    pub(crate) fn restart(&mut self) -> Result<(), SimError> {
        self.sockets = None;
        self.incarnation += 1;
        self.cache = CacheModel::new(cache_config(&self.config));
        self.next_seq = 0;
        self.history.clear();
        self.started.restart();
        let rebound = Sockets::rebind(&self.ctx, self.rank, &self.config, &self.endpoints)?;
        self.sockets = Some(rebound);
        debug!(engine = %self.config.name, rank = self.rank, "rank restarted");
        Ok(())
    }

    pub(crate) fn resident(&self, tokens: &[i32], salt: Option<&str>) -> (u64, u64) {
        self.cache.resident_salted(tokens, salt)
    }

    pub(crate) fn counts(&self) -> (u64, u64) {
        self.cache.counts()
    }

    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_seq
    }

    pub(crate) fn published(&self) -> Published {
        self.published
    }

    pub(crate) fn set_fault(&mut self, fault: Fault) {
        debug!(engine = %self.config.name, rank = self.rank, ?fault, "fault set");
        self.faults.apply(fault);
    }

    pub(crate) fn send_raw(&mut self, frames: Vec<Vec<u8>>) -> Result<(), SimError> {
        let sockets = self.sockets()?;
        sockets.publisher.send_multipart(frames, 0).map_err(zmq_err(self.rank, "send"))
    }

    fn sockets(&self) -> Result<&Sockets, SimError> {
        self.sockets.as_ref().ok_or(SimError::NotBound { rank: self.rank })
    }

    fn publish(&mut self, events: Vec<CacheEvent>) -> Result<Option<u64>, SimError> {
        if events.is_empty() {
            return Ok(None);
        }
        self.publish_batch(events).map(Some)
    }

    /// Publishes one batch under the next sequence number, unless a fault withholds it (the
    /// number is consumed either way). In the vLLM dialect the batch also enters the replay
    /// history, withheld or not: a fault models a message lost on the way, which replay
    /// recovers.
    fn publish_batch(&mut self, events: Vec<CacheEvent>) -> Result<u64, SimError> {
        self.sockets()?;
        let (count, blocks) = (events.len() as u64, event_blocks(&events));
        let payload = self.encode(events);
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.config.dialect == Dialect::Vllm {
            self.remember(seq, &payload);
        }
        if self.faults.withhold_next() {
            debug!(engine = %self.config.name, rank = self.rank, seq, "batch withheld by a fault");
            return Ok(seq);
        }
        let frames = encode_live(self.config.topic.as_bytes(), seq, payload);
        self.sockets()?.publisher.send_multipart(frames, 0).map_err(zmq_err(self.rank, "send"))?;
        self.published.batches += 1;
        self.published.events += count;
        self.published.blocks += blocks;
        Ok(seq)
    }

    /// Encodes a batch in the configured dialect, with this rank as its `dp_rank`.
    fn encode(&self, events: Vec<CacheEvent>) -> Vec<u8> {
        let batch = BatchRecord {
            timestamp: now_seconds(),
            events: events.into_iter().map(|e| self.record(e)).collect(),
            dp_rank: Some(self.rank),
        };
        encode_batch(&batch, self.config.batch_form, self.config.event_form)
    }

    fn record(&self, event: CacheEvent) -> EventRecord {
        let wire = |h: u64| self.config.hash_mode.to_wire(h);
        match event {
            CacheEvent::Stored { hashes, parent, tokens, tier, salt } => {
                // vLLM's extra_keys: the salt on the first block, nothing on the others.
                let extra_keys = salt.map_or_else(Vec::new, |salt| {
                    let mut keys = vec![None; hashes.len()];
                    keys[0] = ExtraKey::salt(&salt);
                    keys
                });
                let hashes = hashes.into_iter().map(wire).collect();
                let block_size = self.config.block_size;
                let record = StoredRecord::new(hashes, parent.map(wire), tokens, block_size, tier);
                EventRecord::Stored(StoredRecord { extra_keys, ..record })
            }
            CacheEvent::Removed { hashes, tier } => {
                EventRecord::removed(hashes.into_iter().map(wire).collect(), tier)
            }
            CacheEvent::Cleared => EventRecord::cleared(None),
        }
    }
}

/// Blocks named by stored and removed events (a clear names none).
fn event_blocks(events: &[CacheEvent]) -> u64 {
    let blocks = |e: &CacheEvent| match e {
        CacheEvent::Stored { hashes, .. } | CacheEvent::Removed { hashes, .. } => hashes.len(),
        CacheEvent::Cleared => 0,
    };
    events.iter().map(blocks).sum::<usize>() as u64
}

fn cache_config(config: &EngineConfig) -> CacheConfig {
    CacheConfig {
        block_size: config.block_size,
        device_capacity_blocks: config.device_capacity_blocks,
        host_capacity_blocks: config.host_capacity_blocks,
    }
}

fn now_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
