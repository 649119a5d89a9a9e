//! [`SimEngine`]: a simulated engine whose DP ranks live on the process's shared rank threads
//! ([`crate::pool`]), so a thousand engines do not mean a thousand threads.
//!
//! Every method sends a job to the rank's thread and waits for the answer, so when a method
//! returns its effect is done: a batch from `process()` has been handed to the PUB socket, a
//! fault is in force, a restart has re-bound. Tests rely on this instead of sleeping.
//! `SimEngine` is `Send + Sync`; calls for one rank are served in order.
//!
//! With `http_port != 0` (and `serve_http`) the engine also serves `GET /health` (and, with a text model, the
//! OpenAI endpoints of [`crate::openai`]) on 127.0.0.1:`http_port` from its own thread, until
//! it stops; `restart` of a rank leaves it up. In the vLLM dialect it also serves
//! `GET /metrics`, whose `process_start_time_seconds` every restart moves forward.

use std::net::TcpListener;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvdir::wire::Tier;
use tracing::info;

use crate::fault::Fault;
use crate::openai::server::{EngineServer, ServerState};
use crate::openai::{InFlight, RequestLoad};
use crate::pool::{self, RankLink};
use crate::process::ProcessStart;
use crate::rank::{Job, RankState, Sockets};
use crate::{EngineConfig, RankEndpoints, SimError};

/// Where every rank lives, shared by the engine's API and its HTTP server. Closing the links
/// (when the engine drops) makes a later call fail with [`SimError::RankStopped`].
pub(crate) struct Ranks {
    links: Vec<Mutex<Option<RankLink>>>,
    dp_size: u32,
}

impl Ranks {
    /// The number of ranks.
    pub(crate) fn dp_size(&self) -> u32 {
        self.dp_size
    }

    /// Runs `f` on the rank's thread and waits for its result.
    pub(crate) fn call<R, F>(&self, rank: u32, f: F) -> Result<R, SimError>
    where
        R: Send + 'static,
        F: FnOnce(&mut RankState) -> Result<R, SimError> + Send + 'static,
    {
        self.submit(rank, f)?.wait()
    }

    /// Queues `f` on the rank's thread; its result comes through the returned [`Pending`].
    fn submit<R, F>(&self, rank: u32, f: F) -> Result<Pending<R>, SimError>
    where
        R: Send + 'static,
        F: FnOnce(&mut RankState) -> Result<R, SimError> + Send + 'static,
    {
        let link = self
            .links
            .get(rank as usize)
            .ok_or(SimError::NoSuchRank { rank, dp_size: self.dp_size })?;
        let link = *link.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let link = link.ok_or(SimError::RankStopped { rank })?;
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |state| {
            // The caller waits on `answer`; it cannot have gone away.
            let _ = reply.send(f(state));
        });
        if !pool::run(link, job) {
            return Err(SimError::RankStopped { rank });
        }
        Ok(Pending { rank, answer })
    }

    /// Closes every link, then drops the ranks on their threads (after the jobs queued before)
    /// and returns once their sockets are closed.
    fn close(&self) {
        let links = self
            .links
            .iter()
            .map(|link| link.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
        links.collect::<Vec<_>>().into_iter().flatten().for_each(pool::remove);
    }
}

/// The answer to come of a queued call ([`SimEngine::process_queued`]).
#[derive(Debug)]
pub struct Pending<R> {
    rank: u32,
    answer: mpsc::Receiver<Result<R, SimError>>,
}

impl<R> Pending<R> {
    /// Waits until the call has run; then its effect is done, as for the waiting methods.
    pub fn wait(self) -> Result<R, SimError> {
        let rank = self.rank;
        self.answer.recv().map_err(|_| SimError::RankStopped { rank })?
    }
}

/// What one rank has handed to its PUB socket since the engine started (restarts included;
/// batches withheld by a fault and raw messages are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Live batches sent.
    pub batches: u64,
    /// Events in them (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
    pub events: u64,
    /// Blocks named by their stored and removed events (Host copies included).
    pub blocks: u64,
}

/// A running simulated engine.
pub struct SimEngine {
    config: Arc<EngineConfig>,
    ranks: Arc<Ranks>,
    endpoints: Vec<RankEndpoints>,
    load: Arc<RequestLoad>,
    started: Arc<ProcessStart>,
    /// Stopped after the ranks (see `Drop`), so `/health` answers while they stop.
    http: Option<EngineServer>,
}

impl std::fmt::Debug for SimEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEngine")
            .field("name", &self.config.name)
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl SimEngine {
    /// Validates `config`, applies the discovery port rule ([`EngineConfig::resolved`]), binds
    /// every rank's sockets, hands the ranks to the rank threads and, with an `http_port` and
    /// `serve_http`, starts the HTTP server (`/health`, and the OpenAI endpoints of
    /// [`crate::openai`]).
    pub fn start(config: EngineConfig) -> Result<SimEngine, SimError> {
        config.validate()?;
        let config = Arc::new(config.resolved());
        let started = Arc::new(ProcessStart::now());
        let mut ranks = Ranks { links: Vec::new(), dp_size: config.dp_size };
        let mut endpoints = Vec::new();
        for rank in 0..config.dp_size {
            // On an error, the ranks started so far stop when `ranks` drops.
            let (link, bound) = start_rank(&config, rank, &started)?;
            ranks.links.push(Mutex::new(Some(link)));
            endpoints.push(bound);
        }
        let ranks = Arc::new(ranks);
        let load = Arc::new(RequestLoad::new(config.dp_size));
        let mut engine = SimEngine { config, ranks, endpoints, load, started, http: None };
        if engine.config.http_port != 0 && engine.config.serve_http {
            let state = ServerState {
                config: Arc::clone(&engine.config),
                ranks: Arc::clone(&engine.ranks),
                load: Arc::clone(&engine.load),
                started: Arc::clone(&engine.started),
            };
            engine.http = Some(EngineServer::start(state)?);
        }
        info!(engine = %engine.config.name, endpoints = ?engine.endpoints(), "simulated engine started");
        Ok(engine)
    }

    /// The actual, connectable endpoints of every rank, in rank order.
    pub fn endpoints(&self) -> Vec<RankEndpoints> {
        self.endpoints.clone()
    }

    /// The configuration the engine runs with (ports already derived by the discovery rule).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The instance name discovery knows the engine by: `127.0.0.1:<http_port>` with an HTTP
    /// port, else the configured `name`.
    pub fn instance_name(&self) -> String {
        self.config.instance_name()
    }

    /// A request's prefill on `rank`: every complete block of `tokens` becomes Device-resident
    /// (new and Host-only blocks in one `BlockStored` with the right parent, resident ones
    /// touched in the LRU), then evictions happen; all of it in one live batch. Returns its
    /// sequence number, or `None` when nothing changed.
    pub fn process(&self, rank: u32, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        self.process_salted(rank, tokens, None)
    }

    /// [`SimEngine::process`] without waiting: the request is queued on the rank's thread and
    /// [`Pending::wait`] returns its answer once its batch has been handed to the PUB socket.
    /// Requests to one rank run in the order they were queued. A load tool queues a burst of
    /// requests and then waits for all of them, so one thread wake-up serves many.
    pub fn process_queued(
        &self,
        rank: u32,
        tokens: &[i32],
    ) -> Result<Pending<Option<u64>>, SimError> {
        let tokens = tokens.to_vec();
        self.ranks.submit(rank, move |r| r.process(&tokens, None))
    }

    /// [`SimEngine::process`] of a request with vLLM's `cache_salt`: its blocks are keyed
    /// apart from unsalted ones ([`crate::salted_block_hashes`]) and a newly stored first
    /// block carries the salt in its `extra_keys`, as vLLM publishes it.
    pub fn process_salted(
        &self,
        rank: u32,
        tokens: &[i32],
        salt: Option<&str>,
    ) -> Result<Option<u64>, SimError> {
        let (tokens, salt) = (tokens.to_vec(), salt.map(str::to_string));
        self.call(rank, move |r| r.process(&tokens, salt.as_deref()))
    }

    /// Copies the prefix's Device-resident blocks to Host (tokenless `BlockStored`, medium CPU).
    /// Fails with [`SimError::HostDisabled`] when the engine has no Host tier.
    pub fn offload(&self, rank: u32, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        let tokens = tokens.to_vec();
        self.call(rank, move |r| r.offload(&tokens))
    }

    /// Removes only the last complete block of `tokens` from `tier` (no Host copy, children
    /// stay), so tests can make orphans. `None` when the block was not on `tier`.
    pub fn evict(&self, rank: u32, tokens: &[i32], tier: Tier) -> Result<Option<u64>, SimError> {
        let tokens = tokens.to_vec();
        self.call(rank, move |r| r.evict(&tokens, tier))
    }

    /// vLLM's duplicate store: publishes `BlockStored` again for the last complete block of
    /// `tokens` (same hash, parent and tokens), as vLLM does when a fully cached prompt whose
    /// length is a multiple of the block size is sent again and its last block is recomputed
    /// into a second physical copy. `None` when that block is not Device-resident. The cache
    /// is unchanged.
    pub fn store_duplicate(&self, rank: u32, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        let tokens = tokens.to_vec();
        self.call(rank, move |r| r.store_copy(&tokens))
    }

    /// vLLM evicting the older of two copies: publishes `BlockRemoved` for the last complete
    /// block of `tokens` while the block stays cached ([`SimEngine::resident`] still counts
    /// it, and later stores may name it as parent). `None` when it is not Device-resident.
    pub fn remove_duplicate(&self, rank: u32, tokens: &[i32]) -> Result<Option<u64>, SimError> {
        let tokens = tokens.to_vec();
        self.call(rank, move |r| r.remove_copy(&tokens))
    }

    /// What the engine reports as `usage.prompt_tokens_details.cached_tokens` for `tokens`
    /// (with `cache_salt` `salt`) on `rank` right now: the resident prefix
    /// ([`SimEngine::resident_salted`], both tiers), limited in the vLLM dialect to the full
    /// blocks within the first `tokens.len() - 1` tokens.
    pub fn cached_tokens(
        &self,
        rank: u32,
        tokens: &[i32],
        salt: Option<&str>,
    ) -> Result<u64, SimError> {
        let (device, host) = self.resident_salted(rank, tokens, salt)?;
        Ok(self.config.reused_tokens(tokens.len(), device + host))
    }

    /// Publishes `AllBlocksCleared` (no medium) and empties the cache.
    pub fn clear(&self, rank: u32) -> Result<Option<u64>, SimError> {
        self.call(rank, |r| r.clear())
    }

    /// Publishes one live full-state batch: `AllBlocksCleared`, then `BlockStored` of every
    /// resident block, parent-first.
    pub fn publish_full_state(&self, rank: u32) -> Result<u64, SimError> {
        self.call(rank, |r| r.publish_full_state())
    }

    /// Restarts the rank's publisher: sockets closed and re-bound on the same ports, sequence
    /// back to 0, cache and (vLLM) replay history emptied, and a new
    /// [`SimEngine::process_start_time`]. Publishes nothing by itself.
    pub fn restart(&self, rank: u32) -> Result<(), SimError> {
        self.call(rank, |r| r.restart())
    }

    /// Restarts every rank ([`SimEngine::restart`]), as a whole engine process restarts. The
    /// HTTP server stays up on its port.
    pub fn restart_all(&self) -> Result<(), SimError> {
        (0..self.config.dp_size).try_for_each(|rank| self.restart(rank))
    }

    /// The engine process's start time in seconds since the Unix epoch (hundredths), what the
    /// vLLM dialect's `/metrics` reports as `process_start_time_seconds`. Every restart moves
    /// it forward.
    pub fn process_start_time(&self) -> f64 {
        self.started.seconds()
    }

    /// Ground truth: `(device_hit_tokens, host_only_hit_tokens)` of the prefix of complete
    /// blocks up to the first block absent from both tiers; a block on both counts as Device.
    pub fn resident(&self, rank: u32, tokens: &[i32]) -> Result<(u64, u64), SimError> {
        self.resident_salted(rank, tokens, None)
    }

    /// [`SimEngine::resident`] of a request with `cache_salt` `salt`.
    pub fn resident_salted(
        &self,
        rank: u32,
        tokens: &[i32],
        salt: Option<&str>,
    ) -> Result<(u64, u64), SimError> {
        let (tokens, salt) = (tokens.to_vec(), salt.map(str::to_string));
        self.call(rank, move |r| Ok(r.resident(&tokens, salt.as_deref())))
    }

    /// `(device_blocks, host_blocks)` resident on `rank`; a block on both tiers counts in each.
    pub fn counts(&self, rank: u32) -> Result<(u64, u64), SimError> {
        self.call(rank, |r| Ok(r.counts()))
    }

    /// The sequence number the rank's next batch will carry (the current snapshot watermark;
    /// in the vLLM dialect, one past the newest batch in the replay history).
    pub fn next_sequence(&self, rank: u32) -> Result<u64, SimError> {
        self.call(rank, |r| Ok(r.next_sequence()))
    }

    /// What `rank` has published so far.
    pub fn published(&self, rank: u32) -> Result<Published, SimError> {
        self.call(rank, |r| Ok(r.published()))
    }

    /// Switches a fault on or off for `rank`.
    pub fn faults(&self, rank: u32, f: Fault) -> Result<(), SimError> {
        self.call(rank, move |r| {
            r.set_fault(f);
            Ok(())
        })
    }

    /// Sends an arbitrary multipart message on the rank's PUB socket (malformed, wrong topic,
    /// oversized ...). Consumes no sequence number and changes no state.
    pub fn send_raw(&self, rank: u32, frames: Vec<Vec<u8>>) -> Result<(), SimError> {
        self.call(rank, move |r| r.send_raw(frames))
    }

    /// OpenAI requests in flight on this engine right now (always zero without a text model).
    /// [`crate::Registration`] adds `waiting` to the load it reports.
    pub fn in_flight(&self) -> InFlight {
        self.load.in_flight()
    }

    /// OpenAI requests assigned to `rank` and not finished (waiting, prefilling or running):
    /// what the rank rule's tie-break compares.
    pub fn in_flight_on(&self, rank: u32) -> u64 {
        self.load.on_rank(rank)
    }

    /// The live request counters, shared with a registration's load reports.
    pub(crate) fn request_load(&self) -> Arc<RequestLoad> {
        Arc::clone(&self.load)
    }

    /// Stops every rank and closes its sockets. Dropping the engine does the same.
    pub fn stop(self) {}

    /// Runs `f` on the rank's thread and waits for its result.
    fn call<R, F>(&self, rank: u32, f: F) -> Result<R, SimError>
    where
        R: Send + 'static,
        F: FnOnce(&mut RankState) -> Result<R, SimError> + Send + 'static,
    {
        self.ranks.call(rank, f)
    }
}

impl Drop for SimEngine {
    /// Stops the ranks (their sockets are closed and their ports free when `drop` returns),
    /// then the HTTP server (which frees its port before `drop` returns).
    fn drop(&mut self) {
        self.ranks.close();
        wait_released(&self.endpoints, self.config.events_connect.is_some());
        self.http = None;
    }
}

/// Longest wait for libzmq to release a stopped engine's ports.
const RELEASE_DEADLINE: Duration = Duration::from_secs(5);

/// Waits until every port the ranks bound can be bound again (at most [`RELEASE_DEADLINE`] in
/// all). The contexts are shared and outlive the engine, so closing a socket releases its port
/// asynchronously, on libzmq's I/O thread; a test that starts a new engine on the same ports
/// right after `stop` relies on this.
fn wait_released(endpoints: &[RankEndpoints], connects: bool) {
    let deadline = Instant::now() + RELEASE_DEADLINE;
    let bound = endpoints.iter().flat_map(|ep| {
        let event = (!connects).then_some(ep.event.as_str());
        event.into_iter().chain([ep.replay.as_str()])
    });
    for port in bound.filter_map(|ep| ep.rsplit_once(':')?.1.parse::<u16>().ok()) {
        while TcpListener::bind(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        self.close();
    }
}

/// Binds the rank's sockets in a shared context and hands the rank to a rank thread.
fn start_rank(
    config: &Arc<EngineConfig>,
    rank: u32,
    started: &Arc<ProcessStart>,
) -> Result<(RankLink, RankEndpoints), SimError> {
    let (event, replay) = (config.event_side(rank), config.replay_bind_address(rank));
    let context = pool::context();
    let bound = Sockets::bind(&context.0, rank, &event, &replay)?;
    let endpoints = bound.1.clone();
    let state = RankState::new(rank, Arc::clone(config), context, bound, Arc::clone(started));
    Ok((pool::add(state)?, endpoints))
}
