//! Heartbeats without a round trip ([`Beats`]): a fleet of a thousand engines sends two
//! thousand heartbeats a second, and a message to the discovery actor answered back, then a
//! load sent on to the router, woke three threads for each. The HTTP handler now checks a
//! heartbeat against the incarnations discovery publishes here, queues it and answers at once;
//! discovery applies the queue every [`DRAIN_INTERVAL`] in one pass and sends the router one
//! batch of loads. A heartbeat the published view cannot settle (an unknown name, another
//! incarnation: perhaps a registration discovery has not published yet) takes the exact way,
//! a [`super::Heartbeat`] message answered once the registry has it.
//!
//! Discovery stays the one owner of the registry: the view is a copy it publishes whenever the
//! registry's change count moves, and the queue only carries heartbeats to it. A heartbeat
//! accepted from the view that the registry then refuses (re-registered meanwhile) is dropped;
//! the engine's next one gets the exact answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use std::time::Instant;

use kvdir::registry::{LoadMetrics, Registry};

use super::DiscoveryActor;
use crate::router::SetLoad;
use crate::sync::{lock, read, write};

/// How often discovery applies the queued heartbeats: a load reaches routing at most this late.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(20);

/// Instance name -> incarnation.
type Incarnations = HashMap<Arc<str>, Option<Arc<str>>>;

/// The published incarnations and the queued heartbeats, shared by discovery and the handlers.
#[derive(Debug, Default)]
pub struct Beats {
    /// Instance name -> incarnation, as of the registry's change count `.0`. Shared strings: a
    /// queued heartbeat holds the view's, so a heartbeat allocates nothing.
    known: RwLock<(u64, Incarnations)>,
    queue: Mutex<Vec<Queued>>,
}

/// A heartbeat the published view settled, waiting for discovery's next pass.
#[derive(Debug)]
pub(super) struct Queued {
    name: Arc<str>,
    incarnation: Option<Arc<str>>,
    load: LoadMetrics,
}

impl Beats {
    /// Queues a heartbeat when its name and incarnation are the published ones; false when the
    /// view cannot settle it (the sender then goes the exact way, a `Heartbeat` message).
    pub fn offer(&self, name: &str, incarnation: Option<&str>, load: LoadMetrics) -> bool {
        let queued = {
            let known = read(&self.known);
            let Some((name, known)) = known.1.get_key_value(name) else { return false };
            if known.as_deref() != incarnation {
                return false;
            }
            Queued { name: Arc::clone(name), incarnation: known.clone(), load }
        };
        lock(&self.queue).push(queued);
        true
    }

    /// The queued heartbeats, in arrival order.
    pub(super) fn take(&self) -> Vec<Queued> {
        std::mem::take(&mut *lock(&self.queue))
    }

    /// Publishes the registry's incarnations, unless its change count has not moved since.
    pub(super) fn publish(&self, registry: &Registry) {
        let changes = registry.changes();
        if read(&self.known).0 == changes && changes > 0 {
            return;
        }
        let known = registry.instances().map(|i| {
            let incarnation = i.record.identity.incarnation_id.as_deref().map(Arc::from);
            (Arc::from(i.record.name.as_str()), incarnation)
        });
        *write(&self.known) = (changes, known.collect());
    }
}

impl DiscoveryActor {
    /// Applies the queued heartbeats in one pass and sends the router their loads in one
    /// message; then publishes the incarnations if the registry changed.
    pub(super) fn drain_beats(&mut self) {
        let beats = self.beats.take();
        if !beats.is_empty() {
            let now = Instant::now();
            let mut names = Vec::with_capacity(beats.len());
            for hb in beats {
                match self.registry.heartbeat(&hb.name, hb.incarnation.as_deref(), hb.load, now) {
                    Ok(()) => names.push(hb.name),
                    // Re-registered since it was queued: its next heartbeat is answered exactly.
                    Err(e) => tracing::debug!(error = %e, "a queued heartbeat no longer applies"),
                }
            }
            names.sort_unstable();
            names.dedup();
            let loads = names.into_iter().filter_map(|n| self.load_of(String::from(&*n)));
            let loads: Vec<SetLoad> = loads.collect();
            self.set.router().set_loads(loads);
        }
        self.beats.publish(&self.registry);
    }
}
