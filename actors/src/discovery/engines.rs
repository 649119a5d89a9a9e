//! Engines listed by address: each is polled every `engine_poll_interval_ms` (a SUSPECT one
//! every [`SUSPECT_POLL_INTERVAL`] when that is shorter), and the rules of
//! `kvdir::discovery::Engines` turn the answers into its state, load and process identity. A
//! new identity re-plans the engine's streams (they start, or restart cold for another
//! process); anything else updates the router in place.
//!
//! What is asked, by dialect: vLLM and xLLM `/health` (cheap there), then `/metrics`; SGLang
//! `/metrics` alone, which answers liveness and load without running the model, and `/health`
//! only when `/metrics` fails (SGLang's `/health` generates a token and takes a second).

use std::time::{Duration, Instant};

use actix::prelude::*;
use kvdir::config::Dialect;
use kvdir::discovery::{IdentityChange, ListedEngine, Probe};
use kvdir::registry::InstanceState;

use super::messages::EnginePolled;
use super::{DiscoveryActor, ListEngine, UnlistEngine};

/// Upper bound of each poll request.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a SUSPECT listed engine is polled when `engine_poll_interval_ms` is longer: a
/// restarted engine is routable again within this of its `/health` turning 200, not a whole
/// poll interval later. Bounded: one poll in flight per engine, so an engine that does not
/// answer is asked at most once per `POLL_TIMEOUT`, and one that refuses at once ten times a
/// second, at the cost of a refused connection.
pub(super) const SUSPECT_POLL_INTERVAL: Duration = Duration::from_millis(100);

impl DiscoveryActor {
    /// Polls every listed engine that has no poll in flight.
    pub(super) fn poll_engines(&mut self, ctx: &mut Context<Self>) {
        self.take_announced(ctx);
        self.poll_where(ctx, |_| true);
    }

    /// Polls every SUSPECT listed engine that has no poll in flight (every
    /// [`SUSPECT_POLL_INTERVAL`]).
    pub(super) fn poll_suspect_engines(&mut self, ctx: &mut Context<Self>) {
        self.poll_where(ctx, |e| e.instance.state == InstanceState::Suspect);
    }

    fn poll_where(&mut self, ctx: &mut Context<Self>, due: impl Fn(&ListedEngine) -> bool) {
        let due: Vec<(String, String, Dialect, String)> = self
            .engines
            .iter()
            .filter(|e| due(e) && !self.polling.contains(&e.spec.name))
            .map(|e| {
                let s = &e.spec;
                (s.name.clone(), s.url.clone(), s.dialect, s.pod_uid.clone())
            })
            .collect();
        for (name, url, dialect, pod) in due {
            self.polling.insert(name.clone());
            let (me, http) = (ctx.address(), self.http.clone());
            actix::spawn(async move {
                let probe = match dialect {
                    Dialect::Sglang => poll_metrics_first(&http, &url).await,
                    _ => poll(&http, &url).await,
                };
                me.do_send(EnginePolled { name, polled: (url, pod), probe });
            });
        }
    }
}

/// `GET {url}/health` (a 200 is healthy), then `GET {url}/metrics` when healthy.
async fn poll(client: &reqwest::Client, url: &str) -> Probe {
    let health = get_health(client, url).await;
    if health.is_err() {
        return Probe { health, metrics: Err("not polled: unhealthy".into()) };
    }
    Probe { health, metrics: get_metrics(client, url).await }
}

/// `GET {url}/metrics` (an answer is healthy), and `GET {url}/health` only when it fails.
async fn poll_metrics_first(client: &reqwest::Client, url: &str) -> Probe {
    let metrics = get_metrics(client, url).await;
    let health = match &metrics {
        Ok(_) => Ok(()),
        Err(_) => get_health(client, url).await,
    };
    Probe { health, metrics }
}

async fn get_health(client: &reqwest::Client, url: &str) -> Result<(), String> {
    match client.get(format!("{url}/health")).timeout(POLL_TIMEOUT).send().await {
        Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
        Ok(r) => Err(format!("answered {}", r.status())),
        Err(e) => Err(e.to_string()),
    }
}

async fn get_metrics(client: &reqwest::Client, url: &str) -> Result<String, String> {
    match client.get(format!("{url}/metrics")).timeout(POLL_TIMEOUT).send().await {
        Ok(r) if r.status() == reqwest::StatusCode::OK => r.text().await.map_err(|e| e.to_string()),
        Ok(r) => Err(format!("answered {}", r.status())),
        Err(e) => Err(e.to_string()),
    }
}

impl Handler<EnginePolled> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: EnginePolled, ctx: &mut Context<Self>) {
        self.polling.remove(&msg.name);
        let (url, pod) = &msg.polled;
        if self.engines.get(&msg.name).is_some_and(|e| e.spec.url != *url || e.spec.pod_uid != *pod)
        {
            return; // an answer for the engine this name had before (a pod replaced)
        }
        let before = self.engines.get(&msg.name).map(|e| e.instance.state);
        match self.engines.observe(&msg.name, msg.probe, Instant::now()) {
            IdentityChange::Unchanged => {
                let e = self.engines.get(&msg.name);
                if let Some(e) = e.filter(|e| Some(e.instance.state) != before) {
                    let (state, error) = (e.instance.state, e.error.as_deref().unwrap_or(""));
                    tracing::info!(engine = %msg.name, ?state, %error, "engine state");
                }
                self.send_load(msg.name);
            }
            change => {
                let id = self.engines.get(&msg.name).map(|e| e.instance.record.identity.clone());
                let id = id.and_then(|i| i.incarnation_id).unwrap_or_default();
                if change == IdentityChange::Changed {
                    tracing::warn!(engine = %msg.name, process = %id, "engine restarted: its streams start again cold");
                } else {
                    tracing::info!(engine = %msg.name, process = %id, "engine process known: starting its streams");
                }
                self.push_candidates();
                self.reconcile(ctx);
                self.check_parity(&msg.name, ctx);
            }
        }
    }
}

impl Handler<ListEngine> for DiscoveryActor {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: ListEngine, ctx: &mut Context<Self>) -> Self::Result {
        let name = msg.0.name.clone();
        let streams = msg.0.streams();
        // The engine first: a second registration of a listed engine says so, even once the
        // first one's streams run.
        self.engines.add(msg.0, Instant::now())?;
        if let Err(e) = streams.iter().try_for_each(|spec| self.set.check_new(spec)) {
            self.engines.remove(&name);
            return Err(e.to_string());
        }
        self.registered_engines.insert(name.clone());
        tracing::info!(engine = %name, "engine registered");
        self.push_candidates();
        self.poll_engines(ctx);
        Ok(())
    }
}

impl Handler<UnlistEngine> for DiscoveryActor {
    type Result = Result<Vec<String>, String>;

    fn handle(&mut self, msg: UnlistEngine, ctx: &mut Context<Self>) -> Self::Result {
        if !self.registered_engines.remove(&msg.0) {
            return Err(format!(
                "no engine registered by /register named {:?}; /unregister removes only those",
                msg.0
            ));
        }
        let events = self.engines.remove(&msg.0).map(|e| e.spec.events).unwrap_or_default();
        tracing::info!(engine = %msg.0, "engine unregistered");
        self.push_candidates();
        self.reconcile(ctx);
        Ok(events)
    }
}
