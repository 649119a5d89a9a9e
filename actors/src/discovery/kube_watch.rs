//! The Kubernetes side of discovery (the config's `kubernetes`): list the selected pods, then
//! watch them from the list's `resourceVersion`, with bookmarks, feeding the discovery actor
//! ([`PodsListed`], [`PodsWatching`], [`PodsChanged`], [`PodsDown`]); `pods.rs` there turns
//! them into engines.
//!
//! - A watch that ends (the server's timeout) is started again from the last version seen
//!   (an event's or a bookmark's), without a list.
//! - `410 Gone` (the version is too old: compacted, or the API server restarted) lists again,
//!   and the actor reconciles its engines with the list.
//! - Anything else (the API server unreachable, a broken stream, 403, a bad kubeconfig) is
//!   reported and retried with [`Backoff`] (reset by a list or a watch that starts); the
//!   engines known stay, with their credit, until their own streams and polls fail. A broken
//!   connection resumes the watch from the last version; an answer of the API server other
//!   than 410 (such as "too large resource version" from a server that lost its etcd) lists
//!   again. 401, 403 and a missing client config are ERRORs that name the fix.
//!
//! The client is the `kube` crate: the configured kubeconfig, else in-cluster config
//! (service-account token and CA), else `$KUBECONFIG` or `~/.kube/config`.

use std::time::{Duration, Instant};

use actix::Addr;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod as KubePod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kvdir::backoff::Backoff;
use kvdir::config::kubernetes::{KubernetesConfig, PodNamespace};
use kvdir::discovery::pods::Pod;

use super::messages::{PodChange, PodsChanged, PodsDown, PodsListed, PodsWatching};
use super::DiscoveryActor;

/// Retry delays after a failure, doubling.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The server ends each watch after this (kube's client gives up reading after 295 s).
const WATCH_SECONDS: u32 = 240;
/// A watch that is silent this long after it starts was accepted (a refusal is its first
/// line).
const SETTLED: Duration = Duration::from_secs(1);
/// Pods per list page.
const PAGE: u32 = 500;
/// Where a pod finds its namespace in a cluster.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// How one list or watch ended.
enum Ended {
    /// The watch ended normally: watch again from this version.
    Resume(String),
    /// 410 Gone: list again.
    Relist(String),
    /// A failure: back off, then watch from the version (if any) or list. `operator`: only an
    /// operator fixes it (401, 403, no client config).
    Failed { error: String, resume: Option<String>, operator: bool },
}

/// Lists and watches the pods `cfg` selects in `namespace` ([`resolve_namespace`]), forever,
/// feeding `discovery`.
pub async fn run(discovery: Addr<DiscoveryActor>, cfg: KubernetesConfig, namespace: String) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    let mut api: Option<Api<KubePod>> = None;
    let mut resume: Option<String> = None;
    loop {
        let ended = match &api {
            Some(api) => {
                let at = Target { api, selector: &cfg.selector, namespace: &namespace };
                watch_once(&discovery, &at, resume.take(), &mut backoff).await
            }
            None => match client(&cfg, &namespace).await {
                Ok(a) => {
                    api = Some(a);
                    continue;
                }
                Err(error) => Ended::Failed { error, resume: None, operator: true },
            },
        };
        if !discovery.connected() {
            return;
        }
        match ended {
            Ended::Resume(version) => resume = Some(version),
            Ended::Relist(why) => {
                tracing::info!(namespace = %namespace, reason = %why, "kubernetes: listing the pods again");
            }
            Ended::Failed { error, resume: version, operator } => {
                resume = version;
                discovery.do_send(PodsDown { error, operator });
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// `"*"` for every namespace, else the one named, else kvdir's own (its service account's
/// namespace in a cluster), else `default`.
pub fn resolve_namespace(ns: &PodNamespace) -> String {
    match ns {
        PodNamespace::All => "*".into(),
        PodNamespace::Named(n) => n.clone(),
        PodNamespace::Own => std::fs::read_to_string(NAMESPACE_FILE)
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
    }
}

/// The pods API: from the configured kubeconfig, else in-cluster, else the default kubeconfig.
async fn client(cfg: &KubernetesConfig, namespace: &str) -> Result<Api<KubePod>, String> {
    let options = KubeConfigOptions::default();
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| format!("kubernetes.kubeconfig {path:?}: {}", chain(&e)))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("kubernetes.kubeconfig {path:?}: {}", chain(&e)))?
        }
        None => match kube::Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                format!(
                    "no Kubernetes client config: not in a cluster ({}) and no kubeconfig \
                     ({}); run kvdir in a pod with a service account, set $KUBECONFIG, or give \
                     kubernetes.kubeconfig",
                    chain(&in_cluster),
                    chain(&e)
                )
            })?,
        },
    };
    let client = kube::Client::try_from(config).map_err(|e| chain(&e))?;
    Ok(match namespace {
        "*" => Api::all(client),
        ns => Api::namespaced(client, ns),
    })
}

/// The pods watched.
struct Target<'a> {
    api: &'a Api<KubePod>,
    selector: &'a str,
    namespace: &'a str,
}

/// Lists the pods (unless resuming from a version), then watches from the version.
async fn watch_once(
    discovery: &Addr<DiscoveryActor>,
    at: &Target<'_>,
    resume: Option<String>,
    backoff: &mut Backoff,
) -> Ended {
    let Target { api, selector, namespace } = *at;
    let version = match resume {
        Some(v) => v,
        None => match list(api, selector).await {
            Ok((pods, version)) => {
                let listed = PodsListed { pods, resource_version: version.clone() };
                if discovery.send(listed).await.is_err() {
                    return stopped();
                }
                backoff.reset();
                version
            }
            Err(e) => return failed(e, "list", namespace, None),
        },
    };
    let params = WatchParams::default().labels(selector).timeout(WATCH_SECONDS);
    let events = match api.watch(&params, &version).await {
        Ok(s) => s.boxed(),
        Err(e) => return failed(e, "watch", namespace, Some(version)),
    };
    follow(discovery, events, version, namespace, backoff).await
}

/// Feeds one watch's events to `discovery` until it ends. The API server refuses a watch (403,
/// 410) in the first line of its answer: a watch whose first line is no error, or that is
/// silent for [`SETTLED`], runs, and is reported as such ([`PodsWatching`]).
async fn follow(
    discovery: &Addr<DiscoveryActor>,
    mut events: BoxStream<'_, kube::Result<WatchEvent<KubePod>>>,
    mut version: String,
    namespace: &str,
    backoff: &mut Backoff,
) -> Ended {
    let started = Instant::now();
    let mut first = match tokio::time::timeout(SETTLED, events.next()).await {
        Ok(None) => return Ended::Resume(version),
        Ok(Some(event)) => Some(event),
        Err(_) => None,
    };
    if !matches!(first, Some(Err(_) | Ok(WatchEvent::Error(_)))) {
        backoff.reset();
        let watching = PodsWatching { resource_version: version.clone() };
        if discovery.send(watching).await.is_err() {
            return stopped();
        }
    }
    while let Some(event) = match first.take() {
        Some(e) => Some(e),
        None => events.next().await,
    } {
        let (deleted, p) = match event {
            Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => (false, p),
            Ok(WatchEvent::Deleted(p)) => (true, p),
            Ok(WatchEvent::Bookmark(b)) => {
                version = b.metadata.resource_version;
                continue;
            }
            Ok(WatchEvent::Error(e)) => {
                return failed(kube::Error::Api(e), "watch", namespace, Some(version))
            }
            Err(e) => return failed(e, "watch", namespace, Some(version)),
        };
        version = p.metadata.resource_version.clone().unwrap_or(version);
        let pod = view(&p);
        let change = if deleted { PodChange::Deleted(pod) } else { PodChange::Applied(pod) };
        let msg = PodsChanged { change, resource_version: version.clone() };
        if discovery.send(msg).await.is_err() {
            return stopped();
        }
    }
    let seconds = started.elapsed().as_secs();
    tracing::debug!(seconds, "kubernetes: watch ended; watching again");
    Ended::Resume(version)
}

/// Every selected pod, page by page, and the list's version.
async fn list(api: &Api<KubePod>, selector: &str) -> Result<(Vec<Pod>, String), kube::Error> {
    let mut pods = Vec::new();
    let mut params = ListParams::default().labels(selector).limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        pods.extend(page.items.iter().map(view));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((pods, page.metadata.resource_version.unwrap_or_default())),
        }
    }
}

/// What a failed call means: 410 lists again; anything else is reported, with the fix for
/// 401 and 403.
fn failed(e: kube::Error, verb: &str, namespace: &str, resume: Option<String>) -> Ended {
    let status = match &e {
        kube::Error::Api(r) => Some(r.code),
        _ => None,
    };
    let detail = match &e {
        kube::Error::Api(r) => format!("{} {}: {}", r.code, r.reason, r.message),
        other => chain(other),
    };
    let scope = match namespace {
        "*" => "in any namespace".to_string(),
        ns => format!("in namespace {ns:?}"),
    };
    let error = match status {
        Some(410) => return Ended::Relist(detail),
        Some(403) => format!(
            "kubernetes: forbidden to {verb} pods {scope} ({detail}); grant kvdir's service \
             account get, list and watch on pods there (the Role and RoleBinding of \
             deploy/kubernetes/base/rbac.yaml or docs/operations.md, Engine pods on Kubernetes; \
             a ClusterRole for \"*\")"
        ),
        Some(401) => format!(
            "kubernetes: the API server refused kvdir's credentials to {verb} pods ({detail}); \
             check the service account token or the kubeconfig's user"
        ),
        _ => format!("kubernetes: cannot {verb} pods {scope}: {detail}"),
    };
    // The server answered: the version may be what it refuses, so list again.
    let resume = resume.filter(|_| status.is_none());
    Ended::Failed { error, resume, operator: matches!(status, Some(401 | 403)) }
}

/// The discovery actor is gone: the loop ends.
fn stopped() -> Ended {
    Ended::Failed { error: "discovery stopped".into(), resume: None, operator: false }
}

/// An error and its sources, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

/// What kvdir reads of a pod.
fn view(p: &KubePod) -> Pod {
    let (m, status) = (&p.metadata, p.status.as_ref());
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    Pod {
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        ready: conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
        ip: status.and_then(|s| s.pod_ip.clone()),
        deleting: m.deletion_timestamp.is_some(),
        labels: m.labels.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
    }
}
