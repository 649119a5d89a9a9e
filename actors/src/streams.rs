//! [`StreamSet`]: starting and stopping the actor pair of one stream (a supervised
//! `StreamActor` and its `IndexActor`), and registering it with the router.
//!
//! Static configuration starts every stream once; discovery starts and stops them as instances
//! come and go. Stopping unregisters the view first, so a query never sees a stopped stream, then
//! ends the worker thread and both actors (the supervisor ends once no address is left).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use actix::prelude::*;
use kvdir::config::{Limits, StreamSpec};
use kvdir::index::StreamIndex;
use kvdir::registry::Identity;

use crate::index_actor::{IndexActor, StreamShared};
use crate::metrics::StreamCounters;
use crate::router_actor::{RegisterStream, RouterActor, StreamKey, UnregisterStream};
use crate::stream_actor::{Shutdown, StreamActor, WorkerThreads};

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
        StreamSet { router, arbiters, zmq, limits, map, threads }
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

    /// Starts a stream and waits until the router answers for it.
    pub async fn start(
        &self,
        spec: StreamSpec,
        identity: Option<Identity>,
    ) -> Result<(), MailboxError> {
        let key = StreamKey { instance_name: spec.instance_name.clone(), dp_rank: spec.dp_rank };
        let n = self.map.read().map(|m| m.len()).unwrap_or(0);
        let arb = &self.arbiters[n % self.arbiters.len()];
        let shared = Arc::new(StreamShared::new(&spec.instance_name, spec.dp_rank));
        let (tx, rx) = std::sync::mpsc::channel();
        let index = IndexActor::new(
            StreamIndex::new(spec.index_config(&self.limits)),
            Arc::clone(&shared),
            tx,
        );
        let reader = index.reader();
        let counters = Arc::clone(&shared.counters);
        self.router
            .send(RegisterStream { key: key.clone(), reader, identity: identity.clone() })
            .await?;
        let index = IndexActor::start_in_arbiter(arb, |_| index);
        let (s, limits, zmq, idx) =
            (spec.clone(), self.limits.clone(), self.zmq.clone(), index.clone());
        let threads = self.threads.clone();
        let stream = Supervisor::start_in_arbiter(arb, move |_| {
            StreamActor::new(s, limits, idx, shared, rx, zmq, threads)
        });
        if let Ok(mut m) = self.map.write() {
            m.insert(key, RunningStream { spec, identity, stream, counters, index });
        }
        Ok(())
    }

    /// Stops a stream: its entries leave query answers at once.
    pub async fn stop(&self, key: &StreamKey) {
        let Some(running) = self.map.write().ok().and_then(|mut m| m.remove(key)) else { return };
        let _ = self.router.send(UnregisterStream { key: key.clone() }).await;
        running.stream.do_send(Shutdown);
        running.index.do_send(Shutdown);
    }
}
