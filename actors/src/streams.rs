//! [`StreamSet`]: starting and stopping the actor pair of one stream (a supervised
//! `StreamActor` and its `IndexActor`), and its slot in the shared index of its block size and
//! seed ([`Indexes`]).
//!
//! Static configuration starts every stream once; discovery starts and stops them as instances
//! come and go. Starting publishes the stream's (unsynchronized) entry before it returns.
//! Stopping waits until the `IndexActor` has dropped the stream's writer, so a query never sees
//! a stopped stream and its slot is free for the next one; then the worker thread ends and the
//! supervisor ends once no address is left.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use kvdir::config::{Limits, StreamSpec};
use kvdir::index::{SharedError, StreamLabel};
use kvdir::registry::Identity;
use thiserror::Error;

use crate::index_actor::{IndexActor, StreamShared};
use crate::indexes::Indexes;
use crate::metrics::StreamCounters;
use crate::router_actor::{RouterActor, StreamKey};
use crate::stream_actor::{Shutdown, StreamActor, WorkerThreads};

/// Why a stream could not start.
#[derive(Debug, Error)]
pub enum StartStreamError {
    /// The stream could not join its shared index.
    #[error(transparent)]
    Index(#[from] SharedError),
}

/// A running stream.
#[derive(Clone)]
pub struct RunningStream {
    /// Its settings.
    pub spec: StreamSpec,
    /// The process it was started for (discovery), if any.
    pub identity: Option<Identity>,
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
    router: Addr<RouterActor>,
    indexes: Arc<Indexes>,
    arbiters: Vec<ArbiterHandle>,
    zmq: zmq::Context,
    limits: Limits,
    map: StreamMap,
    threads: WorkerThreads,
}

impl StreamSet {
    /// A set whose index and stream actors run on `arbiters` (round robin).
    pub fn new(router: Addr<RouterActor>, arbiters: Vec<ArbiterHandle>, limits: Limits) -> Self {
        let (zmq, map, threads) =
            (zmq::Context::new(), StreamMap::default(), WorkerThreads::default());
        let indexes = Arc::default();
        StreamSet { router, indexes, arbiters, zmq, limits, map, threads }
    }

    /// The shared indexes the streams write to and queries read.
    pub fn indexes(&self) -> Arc<Indexes> {
        Arc::clone(&self.indexes)
    }

    /// The router the streams register with.
    pub fn router(&self) -> &Addr<RouterActor> {
        &self.router
    }

    /// The threads of every stream started so far.
    pub fn threads(&self) -> WorkerThreads {
        self.threads.clone()
    }

    /// The running streams.
    pub fn map(&self) -> StreamMap {
        Arc::clone(&self.map)
    }

    /// Keys of the running streams.
    pub fn keys(&self) -> Vec<StreamKey> {
        self.map.read().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }

    /// The running stream for `key`.
    pub fn get(&self, key: &StreamKey) -> Option<RunningStream> {
        self.map.read().ok().and_then(|m| m.get(key).cloned())
    }

    /// Starts a stream; queries list it (unsynchronized) once this returns.
    pub fn start(
        &self,
        spec: StreamSpec,
        identity: Option<Identity>,
    ) -> Result<(), StartStreamError> {
        let key = StreamKey { instance_name: spec.instance_name.clone(), dp_rank: spec.dp_rank };
        let n = self.map.read().map(|m| m.len()).unwrap_or(0);
        let arb = &self.arbiters[n % self.arbiters.len()];
        let label = StreamLabel {
            instance_name: spec.instance_name.clone(),
            dp_rank: spec.dp_rank,
            identity: identity.clone(),
        };
        let writer = self.indexes.add_stream(spec.index_config(&self.limits), label)?;
        let shared = Arc::new(StreamShared::new(&spec.instance_name, spec.dp_rank, writer));
        let index = IndexActor::new(Arc::clone(&shared));
        let counters = Arc::clone(&shared.counters);
        let index = IndexActor::start_in_arbiter(arb, |_| index);
        let (s, limits, zmq, idx) =
            (spec.clone(), self.limits.clone(), self.zmq.clone(), index.clone());
        let threads = self.threads.clone();
        let stream = Supervisor::start_in_arbiter(arb, move |_| {
            StreamActor::new(s, limits, idx, shared, zmq, threads)
        });
        if let Ok(mut m) = self.map.write() {
            m.insert(key, RunningStream { spec, identity, stream, counters, index });
        }
        Ok(())
    }

    /// Stops a stream: when this returns, its entry and bits have left query answers.
    pub async fn stop(&self, key: &StreamKey) {
        let handles = self.map.read().ok().and_then(|m| {
            m.get(key).map(|running| (running.stream.clone(), running.index.clone()))
        });
        let Some((stream, index)) = handles else { return };
        stream.do_send(Shutdown);
        // Drops the writer (waiting for a write in progress); a closed mailbox means the
        // actor, and with it the writer, is gone already.
        let _ = index.send(Shutdown).await;
        // Only now, with its bits gone from the shared index, does the stream leave the map:
        // a report that no longer lists it never meets a query answer that still does.
        if let Ok(mut map) = self.map.write() {
            map.remove(key);
        }
    }
}
