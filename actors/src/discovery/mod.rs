//! `DiscoveryActor`: the one owner of the instance set. It follows the instance registry in etcd
//! (when `--etcd_addr` is set) and the engine pods of Kubernetes (`kubernetes`), polls the
//! engines listed by address (`engines.rs`), and keeps one stream per DP rank of every
//! subscribable instance.
//!
//! Messages: [`EtcdListed`], [`EtcdChanged`], [`EtcdDown`] (from the watch task), `Probed`
//! (from `/health` probes), [`Heartbeat`] (the exact way; most heartbeats come through the
//! queue of [`Beats`], `beats.rs`), [`GetInstances`], for listed engines `EnginePolled`,
//! [`ListEngine`] and [`UnlistEngine`], and for engine pods (`kubernetes`) [`PodsListed`],
//! [`PodsChanged`] and [`PodsDown`] (from `kube_watch.rs`).
//! The rules live in `kvdir::registry` (state machine and planning); this actor feeds them and,
//! every `refresh_interval`, reconciles the running streams with the plan: new streams start
//! cold, vanished ones stop, and a changed endpoint, DP topology or process identity restarts a
//! stream with an empty index, so a replacement gets no credit before its own snapshot.

mod announced;
mod apply;
mod approx;
mod beats;
mod engines;
mod etcd_watch;
mod kube_watch;
mod messages;
mod parity;
mod pods;
mod report;

use apply::{apply_plans, Applied, Plans};
pub use beats::{Beats, DRAIN_INTERVAL};
use messages::Probed;
pub use messages::{
    Change, EngineReport, EtcdChanged, EtcdDown, EtcdListed, GetInstances, Heartbeat,
    InstanceReport, InstancesReport, ListEngine, UnlistEngine,
};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvdir::config::{DiscoveryConfig, EngineSpec, Limits};
use kvdir::discovery::{plan, Engines, Exclusion};
use kvdir::registry::{
    namespace_prefix, parse_instance, parse_key, parse_load_bytes, HeartbeatError, Instance,
    Registry, RegistryKey,
};

use crate::router::{InstanceInfo, SetLoad};
use crate::stream::StreamSet;

/// How often the registry's timeouts are applied when no discovery config sets a refresh.
const REGISTRY_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// Owns the instance set: the registry in etcd, the listed engines and their streams.
pub struct DiscoveryActor {
    /// Set when discovered instances get streams; without it the actor only keeps the
    /// registry (states, loads, heartbeats) that routing needs.
    cfg: Option<DiscoveryConfig>,
    max_streams: usize,
    etcd_addr: String,
    prefix: String,
    registry: Registry,
    set: StreamSet,
    excluded: BTreeMap<String, Exclusion>,
    etcd_connected: bool,
    etcd_error: Option<String>,
    listings: u64,
    listed_keys: usize,
    reconciling: bool,
    /// The last plan applied in full (a refresh with the same plan does nothing).
    applied: Option<Applied>,
    /// Engines listed by address, and which of them came from `POST /register`.
    engines: Engines,
    registered_engines: BTreeSet<String>,
    /// Engines that announced themselves, by name, with their topic (`announced.rs`).
    announced: BTreeMap<String, String>,
    /// Where engine pods are found (`kubernetes`, and the namespace it names), and what was
    /// found (`pods.rs`).
    kubernetes: Option<(kvdir::config::kubernetes::KubernetesConfig, String)>,
    pods: Option<pods::PodEngines>,
    /// How often listed engines are polled, and the polls in flight.
    poll_interval: Duration,
    polling: BTreeSet<String>,
    /// One HTTP client (and connection pool) for every `/health` probe and engine poll.
    http: reqwest::Client,
    /// The front door's tokenizer: listed engines are checked against it (`parity.rs`).
    text: Option<Arc<kvdir_text::TextModel>>,
    /// Heartbeats queued by the HTTP handlers, and the incarnations published to them.
    beats: Arc<Beats>,
    /// The registry's change count when the router last got the whole snapshot.
    pushed: Option<u64>,
}

impl DiscoveryActor {
    /// The registry on `etcd_addr` (none when empty) under `namespace`; with `Some(cfg)`,
    /// discovered instances also get streams through `set`.
    pub fn new(
        cfg: Option<DiscoveryConfig>,
        limits: &Limits,
        etcd_addr: String,
        namespace: &str,
        set: StreamSet,
    ) -> Self {
        DiscoveryActor {
            cfg: cfg.filter(|c| c.enabled),
            max_streams: limits.max_streams,
            etcd_addr,
            prefix: namespace_prefix(namespace),
            registry: Registry::default(),
            set,
            excluded: BTreeMap::new(),
            etcd_connected: false,
            etcd_error: None,
            listings: 0,
            listed_keys: 0,
            reconciling: false,
            applied: None,
            engines: Engines::default(),
            registered_engines: BTreeSet::new(),
            announced: BTreeMap::new(),
            kubernetes: None,
            pods: None,
            poll_interval: Duration::from_secs(1),
            polling: BTreeSet::new(),
            // No proxy: engines are reached directly. Building fails only without a TLS or
            // DNS backend, which this build does not use; then the default client serves.
            http: reqwest::Client::builder().no_proxy().build().unwrap_or_default(),
            text: None,
            beats: Arc::default(),
            pushed: None,
        }
    }

    /// Takes the heartbeats the HTTP handlers queue in `beats`.
    pub fn with_beats(mut self, beats: Arc<Beats>) -> Self {
        self.beats = beats;
        self
    }

    /// Also checks each listed engine's tokenizer against `text`, kvdir's own (`parity.rs`).
    pub fn with_parity(mut self, text: Option<Arc<kvdir_text::TextModel>>) -> Self {
        self.text = text;
        self
    }

    /// Also the engines listed in the config, polled every `poll_interval`.
    pub fn with_engines(mut self, engines: Vec<EngineSpec>, poll_interval: Duration) -> Self {
        for e in engines {
            // The config has no duplicate names (checked when it was read).
            let _ = self.engines.add(e, Instant::now());
        }
        self.poll_interval = poll_interval;
        self
    }

    /// Also the engines of the pods `cfg` selects (`kube_watch.rs`, `pods.rs`).
    pub fn with_kubernetes(
        mut self,
        cfg: Option<kvdir::config::kubernetes::KubernetesConfig>,
    ) -> Self {
        let namespace = cfg.as_ref().map(|c| kube_watch::resolve_namespace(&c.namespace));
        self.pods = cfg
            .as_ref()
            .zip(namespace.as_ref())
            .map(|(c, ns)| pods::PodEngines::new(ns, &c.selector));
        self.kubernetes = cfg.zip(namespace);
        self
    }

    /// Registered instances routing sees: those of etcd (unless a listed engine has the same
    /// name: the listing wins), then the listed engines, each with its base URL if any.
    fn instances(&self) -> impl Iterator<Item = (&Instance, Option<&str>)> {
        let etcd = self
            .registry
            .instances()
            .filter(|i| !self.engines.contains(&i.record.name))
            .map(|i| (i, None));
        etcd.chain(self.engines.iter().map(|e| (&e.instance, Some(e.spec.url.as_str()))))
    }

    /// Applies one registry change and says what it did to the router's snapshot.
    fn apply(&mut self, change: Change, ctx: &mut Context<Self>) -> Touched {
        match change {
            Change::Put(key, value) => self.apply_put(&key, &value),
            Change::Delete(key) => match parse_key(&self.prefix, &key) {
                Some(RegistryKey::Instance(_, name)) => {
                    self.probe(name, ctx);
                    Touched::All
                }
                Some(RegistryKey::Load(name)) => {
                    self.registry.load_deleted(&name);
                    Touched::Nothing
                }
                None => Touched::Nothing,
            },
        }
    }

    /// A registration or a load report written; a bad value is logged and ignored.
    fn apply_put(&mut self, key: &str, value: &[u8]) -> Touched {
        match parse_key(&self.prefix, key) {
            Some(RegistryKey::Instance(_, name)) => match parse_instance(&name, value) {
                Ok(record) => {
                    let outcome = self.registry.put(record, Instant::now());
                    tracing::info!(instance = %name, ?outcome, "instance registered");
                    Touched::All
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "ignoring an instance value");
                    Touched::Nothing
                }
            },
            Some(RegistryKey::Load(name)) => match parse_load_bytes(value) {
                Ok(l) => {
                    self.registry.load(&name, l);
                    Touched::Load(name)
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "ignoring a load value");
                    Touched::Nothing
                }
            },
            None => Touched::Nothing,
        }
    }

    /// A registration vanished: `/health` decides between the grace period and SUSPECT. Only
    /// an ACTIVE instance is probed (see [`Registry::deleted`]); the answer is dropped if the
    /// name registered again meanwhile.
    fn probe(&mut self, name: String, ctx: &mut Context<Self>) {
        let Some(ticket) = self.registry.deleted(&name) else { return };
        let (me, http) = (ctx.address(), self.http.clone());
        actix::spawn(async move {
            let healthy = etcd_watch::probe_health(&http, &name).await;
            me.do_send(Probed { name, ticket, healthy });
        });
    }

    /// Sends the router one instance's load, state and report count, updated in place there.
    fn send_load(&self, name: String) {
        if let Some(load) = self.load_of(name) {
            self.set.router().set_loads(vec![load]);
        }
    }

    /// The router's copy of `name`'s load, when the instance is known.
    pub(super) fn load_of(&self, name: String) -> Option<SetLoad> {
        let engine = self.engines.get(&name).map(|e| &e.instance);
        let i = engine.or_else(|| self.registry.get(&name))?;
        let (load, state, load_reports) = (i.load, i.state, i.load_reports);
        let rank_loads = self.rank_loads(&name);
        Some(SetLoad { name, load, state, load_reports, rank_loads })
    }

    /// Each DP rank's load, where a listed engine reports one per rank.
    fn rank_loads(&self, name: &str) -> Vec<kvdir::car::RankLoad> {
        self.engines.get(name).map_or_else(Vec::new, |e| e.rank_loads.clone())
    }

    /// Who picks the DP rank of `i`: kvdir, where its engine takes the rank with the request
    /// ([`kvdir::config::Dialect::rank_header`]) and has more than one; else the engine.
    fn dp_routing(&self, i: &Instance) -> kvdir::car::DpRouting {
        let dialect = match self.engines.get(&i.record.name) {
            Some(e) => Some(e.spec.dialect),
            None => kvdir::config::Dialect::parse(&i.record.backend),
        };
        match dialect.and_then(|d| d.rank_header()) {
            Some(_) if i.record.dp_size > 1 => kvdir::car::DpRouting::Kvdir,
            _ => kvdir::car::DpRouting::Engine,
        }
    }

    /// Sends the router the instance snapshot it routes with.
    fn push_candidates(&mut self) {
        self.pushed = Some(self.registry.changes());
        let infos = self
            .instances()
            .map(|(i, url)| InstanceInfo {
                candidate: kvdir::car::Candidate {
                    name: i.record.name.clone(),
                    kind: i.record.kind,
                    mix_acting_prefill: i.record.mix_acting_prefill,
                    state: i.state,
                    load: i.load,
                    dp_size: i.record.dp_size,
                    ttft_profile: i.record.ttft_profile.clone(),
                    tpot_profile: i.record.tpot_profile.clone(),
                    hits: Vec::new(),
                    queued: Default::default(),
                    dp_routing: self.dp_routing(i),
                    rank_loads: self.rank_loads(&i.record.name),
                },
                identity: i.record.identity.clone(),
                load_reports: i.load_reports,
                url: url.map(str::to_string),
            })
            .collect();
        self.set.directory().approximate().set_engines(self.approximate_engines());
        self.set.router().set_candidates(infos);
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        for name in self.registry.tick(Instant::now()) {
            tracing::warn!(instance = %name, "instance removed after SUSPECT timeout");
        }
        // Every change is sent as it happens (a load in place, anything else as a snapshot);
        // the tick sends the snapshot only when its timeouts changed the registry. Re-sent
        // every second regardless, 1,024 instances cost about 1 % of a core idle.
        if self.pushed != Some(self.registry.changes()) {
            self.push_candidates();
        }
        if self.reconciling {
            return;
        }
        let (registry, engines) = (self.registry.changes(), self.engines.planned());
        if self.applied.as_ref().is_some_and(|a| a.holds(registry, &engines, &self.set)) {
            return; // nothing a plan reads changed, and the last plan runs in full
        }
        let mut discovered = match &self.cfg {
            // With "events": "none" the instances have nothing to subscribe to.
            Some(cfg) if !cfg.approximate => plan(self.registry.instances(), cfg, self.max_streams),
            _ => kvdir::discovery::Plan::default(),
        };
        self.engines.exclude_from(&mut discovered);
        for (name, why) in &discovered.excluded {
            // Logged once when it starts, not on every refresh.
            let new = self.excluded.get(name) != Some(why);
            if new && why.needs_operator() {
                tracing::error!(instance = %name, reason = %why, "instance excluded from subscriptions");
            }
        }
        self.excluded = discovered.excluded;
        let plans = Plans { discovery: discovered.streams, engines, registry };
        self.reconciling = true;
        let set = self.set.clone();
        ctx.spawn(async move { apply_plans(&set, plans).await }.into_actor(self).map(
            |applied, a, _| {
                a.reconciling = false;
                a.applied = applied;
            },
        ));
    }
}

/// What one registry change did to the instance snapshot the router routes with.
enum Touched {
    /// Nothing the router sees.
    Nothing,
    /// The load of this instance (if registered).
    Load(String),
    /// Anything else: send the whole snapshot.
    All,
}

impl Actor for DiscoveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if !self.etcd_addr.is_empty() {
            let (me, endpoint) = (ctx.address(), self.etcd_addr.clone());
            actix::spawn(etcd_watch::run(me, endpoint, self.prefix.clone()));
        }
        if let Some((cfg, namespace)) = self.kubernetes.clone() {
            actix::spawn(kube_watch::run(ctx.address(), cfg, namespace));
        }
        // Without subscriptions the tick only applies the registry's timeouts.
        let every = self.cfg.as_ref().map_or(REGISTRY_TICK, |c| c.refresh_interval);
        ctx.run_interval(every, |a, ctx| a.reconcile(ctx));
        ctx.run_interval(DRAIN_INTERVAL, |a, _| a.drain_beats());
        self.poll_engines(ctx);
        ctx.run_interval(self.poll_interval, |a, ctx| a.poll_engines(ctx));
        if self.poll_interval > engines::SUSPECT_POLL_INTERVAL {
            ctx.run_interval(engines::SUSPECT_POLL_INTERVAL, |a, ctx| a.poll_suspect_engines(ctx));
        }
    }
}

impl Handler<EtcdListed> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: EtcdListed, ctx: &mut Context<Self>) {
        self.etcd_connected = true;
        self.listings += 1;
        self.listed_keys = msg.kvs.len();
        self.registry.clear_pending_loads();
        tracing::info!(keys = msg.kvs.len(), revision = msg.revision, "etcd registry listed");
        let listed: std::collections::BTreeSet<String> = msg
            .kvs
            .iter()
            .filter_map(|(k, _)| match parse_key(&self.prefix, k) {
                Some(RegistryKey::Instance(_, name)) => Some(name),
                _ => None,
            })
            .collect();
        let gone: Vec<String> = self
            .registry
            .instances()
            .map(|i| i.record.name.clone())
            .filter(|n| !listed.contains(n))
            .collect();
        for (k, v) in msg.kvs {
            self.apply(Change::Put(k, v), ctx);
        }
        for name in gone {
            self.probe(name, ctx);
        }
        self.push_candidates();
    }
}

impl Handler<EtcdChanged> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: EtcdChanged, ctx: &mut Context<Self>) {
        // Load reports alone (the steady state: every engine rewrites its LOADMETRICS) update
        // their instances in place; any other change sends the whole snapshot.
        let (mut loads, mut all) = (Vec::new(), false);
        for change in msg.0 {
            match self.apply(change, ctx) {
                Touched::All => all = true,
                Touched::Load(name) => loads.push(name),
                Touched::Nothing => {}
            }
        }
        if all {
            self.push_candidates();
        } else if !loads.is_empty() {
            // One lock of the router's state for the batch, not one per instance: a handler
            // deciding a route waits for each.
            let loads: Vec<SetLoad> = loads.into_iter().filter_map(|n| self.load_of(n)).collect();
            self.set.router().set_loads(loads);
        }
    }
}

impl Handler<EtcdDown> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: EtcdDown, _: &mut Context<Self>) {
        // One WARN per outage (or change of error); the retries every few seconds log at DEBUG.
        if self.etcd_connected || self.etcd_error.as_deref() != Some(msg.error.as_str()) {
            tracing::warn!(error = %msg.error, "etcd unavailable; serving what is known and retrying");
        } else {
            tracing::debug!(error = %msg.error, "etcd still unavailable; retrying");
        }
        self.etcd_connected = false;
        self.etcd_error = Some(msg.error);
    }
}

impl Handler<Probed> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: Probed, _: &mut Context<Self>) {
        tracing::info!(instance = %msg.name, healthy = msg.healthy, "lease lost; /health probed");
        self.registry.probed(&msg.name, msg.ticket, msg.healthy, Instant::now());
        self.push_candidates();
    }
}

impl Handler<Heartbeat> for DiscoveryActor {
    type Result = Result<(), HeartbeatError>;

    fn handle(&mut self, msg: Heartbeat, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        self.registry.heartbeat(&msg.name, msg.incarnation_id.as_deref(), msg.load, now)?;
        // Only this instance changed: the router updates it in place.
        self.send_load(msg.name);
        Ok(())
    }
}
