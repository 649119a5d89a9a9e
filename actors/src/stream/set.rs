//! [`StreamSet`]: starting and stopping the actor pair of one stream (a supervised
//! `StreamActor` and its `IndexActor`), and its slot in the shared index of its block size and
//! seed ([`Directory`]).
//!
//! Static configuration starts every stream once; discovery starts and stops them as instances
//! come and go. Starting publishes the stream's (unsynchronized) entry before it returns.
//! Stopping waits until the `IndexActor` has dropped the stream's writer, so a query never sees
//! a stopped stream and its slot is free for the next one; then the worker leaves its I/O thread and the
//! supervisor ends once no address is left.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use kvdir::config::{canonical_endpoint, is_bound, Limits, StreamSpec};
use kvdir::index::{SharedError, StreamLabel};
use kvdir::indexer_api::Registration;
use kvdir::registry::Identity;
use thiserror::Error;

use super::pool::{self, IoPool};
use super::sockets::{self, ZmqContext};
use super::worker::WorkerCtx;
use super::{BindRoutes, StreamCounters};
use super::{IndexActor, StreamShared};
use super::{Shutdown, StreamActor, StreamOrigin};
use crate::directory::Directory;
use crate::router::RouterLink;
use crate::sync::{read, write};

/// Why a stream could not start.
#[derive(Debug, Error)]
pub enum StartStreamError {
    /// The stream could not join its shared index.
    #[error(transparent)]
    Index(#[from] SharedError),
    /// A stream of that instance and rank runs already.
    #[error(
        "instance {instance:?} dp_rank {dp_rank} already has a stream ({origin}); \
         unregister it first or use another instance_id"
    )]
    Duplicate {
        /// The instance.
        instance: String,
        /// The rank.
        dp_rank: u32,
        /// Where the running one comes from.
        origin: StreamSource,
    },
    /// An endpoint is already used by another stream.
    #[error(
        "{endpoint:?} is already a live or replay endpoint of instance {instance:?} dp_rank \
         {dp_rank}; every stream needs its own sockets"
    )]
    Overlap {
        /// The endpoint asked for.
        endpoint: String,
        /// The stream using it.
        instance: String,
        /// Its rank.
        dp_rank: u32,
    },
    /// A stream of the bind endpoint that cannot be routed there.
    #[error("{0}")]
    Bind(String),
    /// `max_streams` streams run already.
    #[error("{running} streams run already, the max_streams limit; raise max_streams (at most 65536) or unregister one")]
    Capacity {
        /// Streams running.
        running: usize,
    },
}

/// A stream's identity: instance and DP rank.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamKey {
    /// Instance name.
    pub instance_name: String,
    /// DP rank.
    pub dp_rank: u32,
}

/// Where a stream comes from, as `/v1/internal/streams` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamSource {
    /// The `streams` list of the config file (or the demo).
    Static,
    /// Discovery from etcd.
    Discovery,
    /// `POST /register` (the indexer API).
    Register,
    /// An engine listed by address (config `engines` or `POST /register` with a `url`).
    Engine,
}

impl std::fmt::Display for StreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StreamSource {
    /// The name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamSource::Static => "static",
            StreamSource::Discovery => "discovery",
            StreamSource::Register => "register",
            StreamSource::Engine => "engine",
        }
    }
}

/// A running stream.
#[derive(Clone)]
pub struct RunningStream {
    /// Its settings.
    pub spec: StreamSpec,
    /// The process it was started for (discovery), if any.
    pub identity: Option<Identity>,
    /// Where it comes from.
    pub source: StreamSource,
    /// Its tenant (registered streams; empty otherwise).
    pub tenant: String,
    /// The subscription.
    pub stream: Addr<StreamActor>,
    /// Its counters for `/metrics`.
    pub counters: Arc<StreamCounters>,
    index: Addr<IndexActor>,
}

/// The running streams, shared with the HTTP layer for reports.
pub type StreamMap = Arc<RwLock<BTreeMap<StreamKey, RunningStream>>>;

/// Starts and stops streams.
#[derive(Clone)]
pub struct StreamSet {
    router: RouterLink,
    directory: Arc<Directory>,
    arbiters: Vec<ArbiterHandle>,
    zmq: ZmqContext,
    limits: Limits,
    map: StreamMap,
    pool: IoPool,
    /// Held while a registration is checked and started, so two cannot both pass the checks.
    registering: Arc<std::sync::Mutex<()>>,
    /// The route table of the bind endpoint, when kvdir binds one.
    bind: Option<BindRoutes>,
    /// Streams started or stopped so far (see [`StreamSet::changes`]).
    changes: Arc<AtomicU64>,
}

impl StreamSet {
    /// A set whose streams write to `directory`, whose index and stream actors run
    /// on `arbiters` (round robin) and whose streams are served by `limits.io_threads` I/O
    /// threads, with at most `zmq_sockets` ZeroMQ sockets (`FdBudget::zmq_sockets`); fails
    /// only if a thread cannot start.
    pub fn new(
        directory: Arc<Directory>,
        router: RouterLink,
        arbiters: Vec<ArbiterHandle>,
        limits: Limits,
        zmq_sockets: usize,
    ) -> std::io::Result<Self> {
        let fds = sockets::raise_fd_limit();
        let replays = limits.max_concurrent_replays;
        let zmq = ZmqContext::new(zmq_sockets);
        let pool = IoPool::start(pool::thread_count(limits.io_threads), replays)?;
        tracing::debug!(open_files = ?fds, io_threads = pool.stats().io_threads.len(), "stream pool");
        let (map, registering) = Default::default();
        let (bind, changes) = (None, Arc::default());
        Ok(StreamSet {
            router,
            directory,
            arbiters,
            zmq,
            limits,
            map,
            pool,
            registering,
            bind,
            changes,
        })
    }

    /// Streams of the bind endpoint are routed by `routes` (the bind receiver's table).
    pub fn with_bind(mut self, routes: BindRoutes) -> Self {
        self.bind = Some(routes);
        self
    }

    /// The bind endpoint's route table, if kvdir binds one.
    pub fn bind(&self) -> Option<&BindRoutes> {
        self.bind.as_ref()
    }

    /// The ZeroMQ context every stream socket lives in.
    pub fn zmq(&self) -> &ZmqContext {
        &self.zmq
    }

    /// The directory the streams write to and queries read.
    pub fn directory(&self) -> Arc<Directory> {
        Arc::clone(&self.directory)
    }

    /// The router the streams register with.
    pub fn router(&self) -> &RouterLink {
        &self.router
    }

    /// The I/O threads serving the streams.
    pub fn pool(&self) -> IoPool {
        self.pool.clone()
    }

    /// The running streams.
    pub fn map(&self) -> StreamMap {
        Arc::clone(&self.map)
    }

    /// Keys of the running streams.
    pub fn keys(&self) -> Vec<StreamKey> {
        read(&self.map).keys().cloned().collect()
    }

    /// Keys of the running streams from `source`.
    pub fn keys_from(&self, source: StreamSource) -> Vec<StreamKey> {
        let from = |m: &BTreeMap<StreamKey, RunningStream>| {
            m.iter().filter(|(_, r)| r.source == source).map(|(k, _)| k.clone()).collect()
        };
        from(&read(&self.map))
    }

    /// Starts a registered stream after the checks every stream passes: no stream of the same
    /// instance and rank, no endpoint shared with another stream, at most `max_streams`.
    pub fn register(&self, reg: Registration) -> Result<(), StartStreamError> {
        let _one_at_a_time = crate::sync::lock(&self.registering);
        self.check_new(&reg.spec)?;
        self.start_as(reg.spec, None, StreamSource::Register, reg.tenant)
    }

    pub(crate) fn check_new(&self, spec: &StreamSpec) -> Result<(), StartStreamError> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let key = StreamKey { instance_name: spec.instance_name.clone(), dp_rank: spec.dp_rank };
        if let Some(run) = map.get(&key) {
            let (instance, dp_rank) = (key.instance_name, key.dp_rank);
            let origin = run.source;
            return Err(StartStreamError::Duplicate { instance, dp_rank, origin });
        }
        self.check_bound(spec)?;
        let socket = |ep: &str| canonical_endpoint(ep).unwrap_or_else(|| ep.to_string());
        let mine = [socket(&spec.endpoint), socket(&spec.replay_endpoint)];
        if mine[0] == mine[1] {
            let (instance, dp_rank) = (key.instance_name, key.dp_rank);
            return Err(StartStreamError::Overlap {
                endpoint: spec.endpoint.clone(),
                instance,
                dp_rank,
            });
        }
        for (k, run) in map.iter() {
            // Bound streams share the bind endpoint; their topics tell them apart.
            for ep in
                [&run.spec.endpoint, &run.spec.replay_endpoint].into_iter().filter(|e| !is_bound(e))
            {
                if let Some(i) = mine.iter().position(|m| *m == socket(ep)) {
                    let endpoint = [&spec.endpoint, &spec.replay_endpoint][i].clone();
                    let (instance, dp_rank) = (k.instance_name.clone(), k.dp_rank);
                    return Err(StartStreamError::Overlap { endpoint, instance, dp_rank });
                }
            }
        }
        if map.len() >= self.limits.max_streams {
            return Err(StartStreamError::Capacity { running: map.len() });
        }
        Ok(())
    }

    /// A stream of the bind endpoint needs one, and a topic and rank no other stream has.
    fn check_bound(&self, spec: &StreamSpec) -> Result<(), StartStreamError> {
        if !is_bound(&spec.endpoint) {
            return Ok(());
        }
        match &self.bind {
            None => Err(StartStreamError::Bind(
                "kvdir binds no endpoint for engines; start it with --kv_events_bind or \
                 kv_events_bind in the config file"
                    .into(),
            )),
            Some(b) if spec.dp_rank >= b.config().ranks => Err(StartStreamError::Bind(format!(
                "dp_rank {} has no bound port: kv_events_bind.ranks = {}; raise ranks",
                spec.dp_rank,
                b.config().ranks
            ))),
            Some(b) if b.contains(&spec.topic, spec.dp_rank) => {
                Err(StartStreamError::Bind(format!(
                    "topic {:?} dp_rank {} on the bind endpoint is another stream's already; \
                     give each engine its own topic",
                    spec.topic, spec.dp_rank
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// The running stream for `key`.
    pub fn get(&self, key: &StreamKey) -> Option<RunningStream> {
        read(&self.map).get(key).cloned()
    }

    /// Starts a stream; queries list it (unsynchronized) once this returns.
    pub fn start(
        &self,
        spec: StreamSpec,
        identity: Option<Identity>,
        source: StreamSource,
    ) -> Result<(), StartStreamError> {
        self.start_as(spec, identity, source, String::new())
    }

    fn start_as(
        &self,
        spec: StreamSpec,
        identity: Option<Identity>,
        source: StreamSource,
        tenant: String,
    ) -> Result<(), StartStreamError> {
        let key = StreamKey { instance_name: spec.instance_name.clone(), dp_rank: spec.dp_rank };
        let n = read(&self.map).len();
        let arb = &self.arbiters[n % self.arbiters.len()];
        let label = StreamLabel {
            instance_name: spec.instance_name.clone(),
            dp_rank: spec.dp_rank,
            identity: identity.clone(),
            model: spec.model.clone(),
            tenant: tenant.clone(),
            // Given by the directory.
            instance_handle: 0,
        };
        // A bound stream subscribes to its keyed topic on the bind receiver's socket.
        let mut worker_spec = spec.clone();
        if is_bound(&spec.endpoint) {
            self.check_bound(&spec)?;
            let routes = self.bind.as_ref().ok_or_else(|| {
                StartStreamError::Bind(format!(
                    "instance {:?} publishes to kv_events_bind, but kvdir binds no endpoint; \
                     set kv_events_bind in the config or --kv_events_bind",
                    spec.instance_name
                ))
            })?;
            worker_spec.topic =
                routes.add(&spec.topic, spec.dp_rank).map_err(StartStreamError::Bind)?;
        }
        let writer = match self.directory.add_stream(spec.index_config(&self.limits), label) {
            Ok(w) => w,
            Err(e) => {
                self.unroute(&spec);
                return Err(e.into());
            }
        };
        let shared = Arc::new(StreamShared::new(&spec.instance_name, spec.dp_rank, writer));
        let index = IndexActor::new(Arc::clone(&shared));
        let counters = Arc::clone(&shared.counters);
        let index = IndexActor::start_in_arbiter(arb, |_| index);
        let worker = WorkerCtx {
            spec: worker_spec,
            limits: self.limits.clone(),
            shared,
            status: Arc::default(),
            zmq: self.zmq.clone(),
        };
        let process = identity.as_ref().and_then(|i| i.incarnation_id.clone());
        let origin = StreamOrigin { source, process };
        let (idx, pool) = (index.clone(), self.pool.clone());
        let stream =
            Supervisor::start_in_arbiter(arb, move |_| StreamActor::new(worker, origin, idx, pool));
        let run = RunningStream { spec, identity, source, tenant, stream, counters, index };
        write(&self.map).insert(key, run);
        self.changes.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// How many times a stream started or stopped: unchanged means the same streams run.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Stops a stream: when this returns, its entry and bits have left query answers.
    pub async fn stop(&self, key: &StreamKey) {
        let Some(run) = self.get(key) else { return };
        // From now on its engine's messages are unknown.
        self.unroute(&run.spec);
        run.stream.do_send(Shutdown);
        // Drops the writer (waiting for a write in progress); a closed mailbox means the
        // actor, and with it the writer, is gone already.
        let _ = run.index.send(Shutdown).await;
        // Only now, with its bits gone from the shared index, does the stream leave the map:
        // a report that no longer lists it never meets a query answer that still does.
        write(&self.map).remove(key);
        self.changes.fetch_add(1, Ordering::Release);
    }
}

impl StreamSet {
    /// Takes a bound stream out of the bind endpoint's route table.
    fn unroute(&self, spec: &StreamSpec) {
        if let (true, Some(b)) = (is_bound(&spec.endpoint), &self.bind) {
            b.remove(&spec.topic, spec.dp_rank);
        }
    }
}
