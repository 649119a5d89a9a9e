//! `GET /v1/internal/instances`: every instance the discovery actor knows, from etcd, listed
//! by address and from pods, with its state, identity, load and streams, and the pod watch's
//! state (`kubernetes`).

use actix::prelude::*;
use kvdir::discovery::ListedEngine;
use kvdir::registry::{Instance, InstanceType};

use super::{DiscoveryActor, EngineReport, GetInstances, InstanceReport, InstancesReport};

impl DiscoveryActor {
    fn report(&self, i: &Instance, keys: &[crate::stream::StreamKey]) -> InstanceReport {
        let r = &i.record;
        InstanceReport {
            name: r.name.clone(),
            state: i.state,
            role: r.kind,
            acting_as: (r.kind == InstanceType::Mix).then_some(if r.mix_acting_prefill {
                InstanceType::Prefill
            } else {
                InstanceType::Decode
            }),
            incarnation_id: r.identity.incarnation_id.clone(),
            register_ts_ms: r.identity.register_ts_ms,
            dp_size: r.dp_size,
            backend: r.backend.clone(),
            waiting_requests_num: i.load.map(|l| l.waiting_requests_num),
            gpu_cache_usage_perc: i.load.map(|l| l.gpu_cache_usage_perc),
            streams: keys.iter().filter(|k| k.instance_name == r.name).map(|k| k.dp_rank).collect(),
            excluded: self.excluded.get(&r.name).map(ToString::to_string),
            approximate: self.is_approximate(&r.name),
            approximate_blocks: self
                .set
                .directory()
                .approximate()
                .blocks(&r.name)
                .map(|b| b as u64),
            engine: self.engines.get(&r.name).map(|e| self.engine_report(e)),
        }
    }

    fn engine_report(&self, e: &ListedEngine) -> EngineReport {
        let reading = e.reading.as_ref();
        EngineReport {
            url: e.spec.url.clone(),
            dialect: e.spec.dialect,
            source: if self.registered_engines.contains(&e.spec.name) {
                "register"
            } else if self.announced.contains_key(&e.spec.name) {
                "announce"
            } else if self.pods.as_ref().is_some_and(|p| p.engines.contains(&e.spec.name)) {
                "kubernetes"
            } else {
                "config"
            },
            identity_known: e.identity_known,
            process_start_time_seconds: reading.and_then(|r| r.process_start),
            num_requests_waiting: reading.map(|r| r.waiting),
            num_requests_running: reading.map(|r| r.running),
            kv_cache_usage_perc: reading.map(|r| r.usage),
            prefill_tokens_per_s: e.prefill_rate(),
            polls: e.polls,
            error: e.error.clone(),
            events: e.spec.events.clone(),
            replay: e.spec.replay.clone(),
            block_size: e.spec.block_size,
            model: e.spec.model.clone(),
            parity: e.parity.clone(),
        }
    }
}

impl Handler<GetInstances> for DiscoveryActor {
    type Result = MessageResult<GetInstances>;

    fn handle(&mut self, _: GetInstances, _: &mut Context<Self>) -> Self::Result {
        let keys = self.set.keys();
        let instances = self.instances().map(|(i, _)| self.report(i, &keys)).collect();
        MessageResult(InstancesReport {
            etcd_connected: self.etcd_connected,
            etcd_error: self.etcd_error.clone(),
            etcd_listings: self.listings,
            etcd_listed_keys: self.listed_keys,
            kubernetes: self.pods.as_ref().map(|p| p.report.clone()),
            instances,
        })
    }
}
