//! Engines that announced themselves on the bound endpoint (`kv_events_bind.announce`): each
//! poll tick lists the engines the bind receiver queued, as if registered with `POST
//! /register` (`http://<ip>:<port>`, the topic's model, events on the bound endpoint under
//! their topic, history replay at `replay_port` on the same host), and drops those that have
//! failed their polls for `drop_after_ms`, so a topic of theirs announces them again.

use std::time::Instant;

use actix::prelude::*;
use kvdir::config::announce::{AnnounceConfig, Announced};
use kvdir::config::parse_engine_json_with;
use kvdir::registry::InstanceState;
use serde_json::json;

use super::DiscoveryActor;

impl DiscoveryActor {
    /// Lists the newly announced engines and drops the announced ones gone quiet.
    pub(super) fn take_announced(&mut self, ctx: &mut Context<Self>) {
        let Some(bind) = self.set.bind().cloned() else { return };
        let Some(config) = bind.config().announce.clone() else { return };
        let mut changed = false;
        for (topic, engine) in bind.take_announced() {
            // A refusal stands until the topic's engine is gone from kvdir's memory (a
            // restart): its topic stays announced, so the WARN is logged once.
            match self.list_announced(&topic, &engine, &config) {
                Ok(()) => changed = true,
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "an announced engine cannot be listed")
                }
            }
        }
        let now = Instant::now();
        let gone: Vec<(String, String)> = self
            .announced
            .iter()
            .filter(|(name, _)| {
                self.engines.get(name).is_some_and(|e| {
                    let i = &e.instance;
                    i.state == InstanceState::Suspect && now - i.since >= config.drop_after
                })
            })
            .map(|(name, topic)| (name.clone(), topic.clone()))
            .collect();
        changed |= !gone.is_empty();
        for (name, topic) in gone {
            let e = self.engines.remove(&name).and_then(|e| e.error);
            self.announced.remove(&name);
            bind.forget_announced(&topic);
            tracing::warn!(engine = %name, %topic, error = ?e, "an announced engine failed its polls for drop_after_ms: dropped");
        }
        if changed {
            self.push_candidates();
            self.reconcile(ctx);
        }
    }

    fn list_announced(
        &mut self,
        topic: &str,
        engine: &Announced,
        config: &AnnounceConfig,
    ) -> Result<(), String> {
        let host = engine.host();
        let (ip, replay_port) = (engine.ip, config.replay_port);
        let same_host =
            |name: &String| name.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip() == ip);
        if let Some(other) = self.announced.keys().find(|n| same_host(n)) {
            return Err(format!(
                "engine {other} on the same host announced itself first, and announce gives each \
                 host one replay_port ({replay_port}): list {host} with its own replay endpoint \
                 in the config's engines or POST /register"
            ));
        }
        let replay = std::net::SocketAddr::new(ip, replay_port).to_string();
        let spec = json!({
            "name": host, "url": format!("http://{host}"), "dialect": config.dialect.as_str(),
            "events": "bind", "dp_size": 1, "replay": format!("tcp://{replay}"),
            "block_size": config.block_size, "model": engine.model, "topic": topic,
        });
        let bind = self.set.bind().map(|b| b.config().clone());
        let spec = parse_engine_json_with(&spec, bind.as_ref()).map_err(|e| e.to_string())?;
        for s in spec.streams() {
            self.set.check_new(&s).map_err(|e| e.to_string())?;
        }
        self.engines.add(spec, Instant::now())?;
        self.announced.insert(host.clone(), topic.to_string());
        tracing::info!(engine = %host, %topic, "announced engine listed");
        Ok(())
    }
}
