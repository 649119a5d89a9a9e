//! Engines from Kubernetes pods (the config's `kubernetes`): the pod lists and watch events of
//! `kube_watch.rs` become listed engines, the same ones the config's `engines` and `POST
//! /register` give ([`kvdir::discovery::pods`] decides what a pod serves).
//!
//! - A pod that serves an engine it did not serve before is listed: polled, then its streams
//!   start once its process is known. One whose engine changed (another IP, UID, port,
//!   annotation) is listed again, so its streams restart cold: the old credit is dropped.
//! - A pod that stops serving (NotReady, no IP, being deleted, deleted, no longer selected)
//!   loses its engine and its credit at once.
//! - A pod with a bad description is skipped with one WARN per problem, and shown under
//!   `kubernetes.skipped` in `/v1/internal/instances`.
//! - A list reconciles: engines of pods no longer listed are removed. A broken watch or an
//!   unreachable API server removes nothing: engines fail on their own, by their polls.
//!
//! Messages: [`PodsListed`], [`PodsWatching`], [`PodsChanged`], [`PodsDown`].

use std::collections::BTreeSet;
use std::time::Instant;

use actix::prelude::*;
use kvdir::discovery::pods::{pod_engine, Pod, PodEngine};

use super::messages::{
    KubernetesReport, PodChange, PodsChanged, PodsDown, PodsListed, PodsWatching,
};
use super::DiscoveryActor;
use crate::stream::StreamSource;

/// The discovery actor's view of the engine pods.
#[derive(Debug, Default)]
pub(super) struct PodEngines {
    /// What `/v1/internal/instances` shows.
    pub(super) report: KubernetesReport,
    /// Pods selected now.
    selected: BTreeSet<String>,
    /// The engines listed from pods, by name (`<namespace>/<pod>`).
    pub(super) engines: BTreeSet<String>,
}

impl PodEngines {
    pub(super) fn new(namespace: &str, selector: &str) -> Self {
        let (namespace, selector) = (namespace.to_string(), selector.to_string());
        let report = KubernetesReport { namespace, selector, ..Default::default() };
        PodEngines { report, ..Default::default() }
    }
}

impl DiscoveryActor {
    /// Applies one pod's state; `true` when the engines changed.
    fn apply_pod(&mut self, pod: &Pod) -> bool {
        let key = pod.key();
        let Some(pods) = self.pods.as_mut() else { return false };
        pods.selected.insert(key.clone());
        match pod_engine(pod) {
            PodEngine::Serving(spec) => self.list_pod_engine(&key, spec),
            PodEngine::NotServing(why) => {
                self.skip(&key, None);
                self.drop_pod_engine(&key, &why.to_string())
            }
            PodEngine::Invalid(problems) => {
                let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
                let dropped = self.drop_pod_engine(&key, "its description is invalid");
                self.skip(&key, Some(text.join("; ")));
                dropped
            }
        }
    }

    /// Lists `spec` for pod `key`, or lists it again when it changed.
    fn list_pod_engine(&mut self, key: &str, spec: kvdir::config::EngineSpec) -> bool {
        let mine = self.pods.as_ref().is_some_and(|p| p.engines.contains(key));
        match self.engines.get(key) {
            Some(_) if !mine => {
                let why = "an engine of this name is listed already (config engines or POST \
                           /register); remove that listing or rename one";
                self.skip(key, Some(why.into()));
                return false;
            }
            Some(e) if e.spec == spec => {
                self.skip(key, None);
                return false;
            }
            Some(_) => self.drop_pod_engine(key, "its engine changed; listing it again cold"),
            None => false,
        };
        if let Err(why) = self.fits(&spec) {
            self.skip(key, Some(why));
            return false;
        }
        let url = spec.url.clone();
        if let Err(why) = self.engines.add(spec, Instant::now()) {
            self.skip(key, Some(why));
            return false;
        }
        self.skip(key, None);
        if let Some(p) = self.pods.as_mut() {
            p.engines.insert(key.to_string());
        }
        tracing::info!(engine = %key, %url, "kubernetes: pod engine listed");
        true
    }

    /// Whether the engine's streams fit `max_streams` beside every other stream.
    fn fits(&self, spec: &kvdir::config::EngineSpec) -> Result<(), String> {
        let others = self.set.keys().len() - self.set.keys_from(StreamSource::Engine).len();
        let listed: usize = self.engines.iter().map(|e| e.spec.events.len()).sum();
        let total = others + listed + spec.events.len();
        if total > self.max_streams {
            return Err(format!(
                "its {} streams would make {total}, more than max_streams = {}; raise max_streams \
                 (at most 65536)",
                spec.events.len(),
                self.max_streams
            ));
        }
        Ok(())
    }

    /// Removes the engine of pod `key`, if it has one; `true` when it had.
    fn drop_pod_engine(&mut self, key: &str, why: &str) -> bool {
        let Some(pods) = self.pods.as_mut() else { return false };
        if !pods.engines.remove(key) {
            return false;
        }
        self.engines.remove(key);
        tracing::info!(engine = %key, reason = %why, "kubernetes: pod engine removed");
        true
    }

    /// Records pod `key`'s problem (`None`: it has none); a new problem is one WARN.
    fn skip(&mut self, key: &str, problem: Option<String>) {
        let Some(pods) = self.pods.as_mut() else { return };
        match problem {
            None => {
                pods.report.skipped.remove(key);
            }
            Some(p) => {
                if pods.report.skipped.get(key) != Some(&p) {
                    tracing::warn!(pod = %key, problem = %p, "kubernetes: pod skipped");
                }
                pods.report.skipped.insert(key.to_string(), p);
            }
        }
    }

    /// After a change of the engines: the router's snapshot, then the streams.
    fn pods_changed(&mut self, changed: bool, ctx: &mut Context<Self>) {
        if let Some(p) = self.pods.as_mut() {
            p.report.pods = p.selected.len();
            p.report.engines = p.engines.len();
        }
        if changed {
            self.push_candidates();
            self.reconcile(ctx);
            self.poll_engines(ctx);
        }
    }
}

impl Handler<PodsListed> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: PodsListed, ctx: &mut Context<Self>) {
        let Some(pods) = self.pods.as_mut() else { return };
        let r = &mut pods.report;
        (r.connected, r.error, r.listings) = (true, None, r.listings + 1);
        r.resource_version = msg.resource_version;
        tracing::info!(namespace = %r.namespace, pods = msg.pods.len(), "kubernetes: pods listed");
        let listed: BTreeSet<String> = msg.pods.iter().map(Pod::key).collect();
        let gone: Vec<String> = pods.selected.difference(&listed).cloned().collect();
        pods.selected = listed;
        let mut changed = false;
        for key in gone {
            changed |= self.drop_pod_engine(&key, "no longer listed");
            self.skip(&key, None);
        }
        for pod in &msg.pods {
            changed |= self.apply_pod(pod);
        }
        self.pods_changed(changed, ctx);
    }
}

impl Handler<PodsWatching> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: PodsWatching, _: &mut Context<Self>) {
        let Some(pods) = self.pods.as_mut() else { return };
        let r = &mut pods.report;
        if !r.connected {
            tracing::info!(namespace = %r.namespace, resource_version = %msg.resource_version, "kubernetes: watching pods");
        }
        (r.connected, r.error, r.resource_version) = (true, None, msg.resource_version);
    }
}

impl Handler<PodsChanged> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: PodsChanged, ctx: &mut Context<Self>) {
        let Some(pods) = self.pods.as_mut() else { return };
        pods.report.resource_version = msg.resource_version;
        let changed = match msg.change {
            PodChange::Applied(pod) => self.apply_pod(&pod),
            PodChange::Deleted(pod) => {
                let key = pod.key();
                pods.selected.remove(&key);
                self.skip(&key, None);
                self.drop_pod_engine(&key, "deleted")
            }
        };
        self.pods_changed(changed, ctx);
    }
}

impl Handler<PodsDown> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: PodsDown, _: &mut Context<Self>) {
        let Some(pods) = self.pods.as_mut() else { return };
        let r = &mut pods.report;
        // One line per outage (or change of error); the retries log at DEBUG. What only an
        // operator fixes (access denied, no client config) is an ERROR.
        let new = r.connected || r.error.as_deref() != Some(msg.error.as_str());
        match (new, msg.operator) {
            (true, true) => {
                tracing::error!(error = %msg.error, "kubernetes: cannot watch pods; retrying")
            }
            (true, false) => tracing::warn!(
                error = %msg.error,
                "kubernetes: pods unavailable; keeping the engines known and retrying"
            ),
            (false, _) => tracing::debug!(error = %msg.error, "kubernetes: still unavailable"),
        }
        (r.connected, r.error) = (false, Some(msg.error));
    }
}
