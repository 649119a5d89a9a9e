//! Which instances get approximate credit ([`crate::directory::Approximate`]) instead of streams:
//! engines listed or registered without `events`, once their process is known, and, with
//! `discovery.events = "none"`, every prefill-side instance found in etcd (blocks of
//! `discovery.block_size` tokens). Discovery names them on every change of its instance set,
//! so an engine that leaves or restarts loses its credit at once.

use kvdir::car::ApproxEngine;

use super::DiscoveryActor;

impl DiscoveryActor {
    /// The engines credited approximately now.
    pub(super) fn approximate_engines(&self) -> Vec<ApproxEngine> {
        let mut out = Vec::new();
        if let Some(cfg) = self.cfg.as_ref().filter(|c| c.approximate) {
            let found = self
                .registry
                .instances()
                .filter(|i| i.record.kind.prefills(i.record.mix_acting_prefill))
                .filter(|i| !self.engines.contains(&i.record.name));
            out.extend(found.map(|i| ApproxEngine {
                name: i.record.name.clone(),
                process: i.record.identity.clone(),
                block_size: cfg.block_size,
                dp_size: i.record.dp_size.max(1),
                model: i.record.model.clone(),
            }));
        }
        let listed = self.engines.iter().filter(|e| e.spec.is_approximate() && e.identity_known);
        out.extend(listed.map(|e| ApproxEngine {
            name: e.spec.name.clone(),
            process: e.instance.record.identity.clone(),
            block_size: e.spec.block_size,
            dp_size: e.spec.dp_size().max(1),
            model: e.spec.model.clone(),
        }));
        out
    }

    /// Whether `name` publishes no KV events (credited approximately once its process is known).
    pub(super) fn is_approximate(&self, name: &str) -> bool {
        match self.engines.get(name) {
            Some(e) => e.spec.is_approximate(),
            None => self.cfg.as_ref().is_some_and(|c| c.approximate),
        }
    }
}
