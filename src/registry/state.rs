//! The instance state machine of protocol.md section 5.1, with time passed in.
//!
//! | trigger | result |
//! |---|---|
//! | PUT, new name | ACTIVE |
//! | PUT, same name, same process | ACTIVE; the index is kept |
//! | PUT, same name, another process | replacement: old streams dropped, new ones start cold |
//! | DELETE of an ACTIVE instance | the caller probes `/health`: 200 -> LEASE_LOST, else SUSPECT |
//! | DELETE (or a re-list without it) while LEASE_LOST or SUSPECT | nothing: no new probe, timers run on |
//! | a probe answer after a newer PUT | discarded |
//! | LEASE_LOST and no heartbeat for 3 s | SUSPECT |
//! | heartbeat with matching incarnation while SUSPECT | LEASE_LOST |
//! | SUSPECT for 15 s | removed |

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::record::{InstanceRecord, LoadMetrics};

/// LEASE_LOST without a heartbeat for this long becomes SUSPECT.
pub const LEASE_LOST_GRACE: Duration = Duration::from_millis(3000);
/// SUSPECT for this long is removed.
pub const SUSPECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Loads kept for names not (yet) registered; more are dropped.
pub const MAX_PENDING_LOADS: usize = 4096;

/// An instance's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum InstanceState {
    /// Registered with a live lease.
    Active,
    /// The lease expired but `/health` answered: subscriptions are kept (the grace period).
    LeaseLost,
    /// Presumed dead: no subscriptions, never a candidate.
    Suspect,
}

/// One known instance.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The latest registration.
    pub record: InstanceRecord,
    /// Its state.
    pub state: InstanceState,
    /// When the state was entered.
    pub since: Instant,
    /// The latest heartbeat.
    pub last_heartbeat: Option<Instant>,
    /// The latest load report (etcd or heartbeat).
    pub load: Option<LoadMetrics>,
    /// Load reports received for this process so far; a router's own in-flight requests
    /// started before the latest report are in that report.
    pub load_reports: u64,
    /// The `/health` probe in flight since a DELETE, if any (see [`Registry::deleted`]).
    pub probe: Option<u64>,
}

/// What a PUT did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new instance.
    New,
    /// The same process re-registered: keep its streams and index.
    Refreshed,
    /// Another process on the same name: drop its streams and index.
    Replaced,
}

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    /// No instance of that name.
    #[error("no registered instance named {0:?}")]
    Unknown(String),
    /// The incarnation is not the registered one.
    #[error(
        "incarnation {got:?} of {name:?} is stale; the registered incarnation is {expected:?}"
    )]
    Stale {
        /// The instance.
        name: String,
        /// Registered.
        expected: Option<String>,
        /// Sent.
        got: Option<String>,
    },
}

/// Every known instance by name.
#[derive(Debug, Default)]
pub struct Registry {
    instances: BTreeMap<String, Instance>,
    /// Loads for names not registered yet (a LOADMETRICS key can be seen before its instance).
    pending_loads: HashMap<String, LoadMetrics>,
    /// The last probe ticket handed out.
    probes: u64,
    /// Bumped whenever what discovery plans from changes (see [`Registry::changes`]).
    changes: u64,
}

impl Registry {
    /// The instances, in name order.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        self.instances.values()
    }

    /// One instance.
    pub fn get(&self, name: &str) -> Option<&Instance> {
        self.instances.get(name)
    }

    /// A count that moves whenever an instance appears, goes, is registered again or changes
    /// state: everything discovery's plan reads. Loads and heartbeats that change no state
    /// leave it, so an unchanged count means an unchanged plan.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// A registration was written.
    pub fn put(&mut self, record: InstanceRecord, now: Instant) -> PutOutcome {
        let fresh = |record, load: Option<LoadMetrics>| Instance {
            record,
            state: InstanceState::Active,
            since: now,
            last_heartbeat: None,
            load_reports: u64::from(load.is_some()),
            load,
            probe: None,
        };
        self.changes += 1;
        match self.instances.get_mut(&record.name) {
            None => {
                let load = self.pending_loads.remove(&record.name);
                self.instances.insert(record.name.clone(), fresh(record, load));
                PutOutcome::New
            }
            Some(i) if i.record.identity.same_process(&record.identity) => {
                i.record = record;
                i.probe = None;
                if i.state != InstanceState::Active {
                    (i.state, i.since) = (InstanceState::Active, now);
                }
                PutOutcome::Refreshed
            }
            Some(i) => {
                // Another process: it is no candidate until it reports its own load.
                *i = fresh(record, None);
                PutOutcome::Replaced
            }
        }
    }

    /// The registration of `name` disappeared (a DELETE, or a re-list without it). Returns a
    /// probe ticket when the caller should probe `/health` and report with
    /// [`Registry::probed`]: only for an ACTIVE instance with no probe in flight. An instance
    /// already LEASE_LOST or SUSPECT keeps its state and the time it entered it.
    pub fn deleted(&mut self, name: &str) -> Option<u64> {
        let i = self.instances.get_mut(name)?;
        if i.state != InstanceState::Active || i.probe.is_some() {
            return None;
        }
        self.probes += 1;
        i.probe = Some(self.probes);
        i.probe
    }

    /// The `/health` probe with `ticket` answered (`healthy`) or not. Ignored when the
    /// instance registered again meanwhile (the ticket is no longer the pending one).
    pub fn probed(&mut self, name: &str, ticket: u64, healthy: bool, now: Instant) {
        if let Some(i) = self.instances.get_mut(name).filter(|i| i.probe == Some(ticket)) {
            let state = if healthy { InstanceState::LeaseLost } else { InstanceState::Suspect };
            (i.state, i.since, i.probe) = (state, now, None);
            self.changes += 1;
        }
    }

    /// A heartbeat with load; a SUSPECT instance with the right incarnation becomes LEASE_LOST.
    pub fn heartbeat(
        &mut self,
        name: &str,
        incarnation: Option<&str>,
        load: LoadMetrics,
        now: Instant,
    ) -> Result<(), HeartbeatError> {
        let i = self.instances.get_mut(name).ok_or_else(|| HeartbeatError::Unknown(name.into()))?;
        let expected = i.record.identity.incarnation_id.as_deref();
        if expected != incarnation {
            return Err(HeartbeatError::Stale {
                name: name.into(),
                expected: expected.map(str::to_string),
                got: incarnation.map(str::to_string),
            });
        }
        i.last_heartbeat = Some(now);
        i.load = Some(load);
        i.load_reports += 1;
        if i.state == InstanceState::Suspect {
            (i.state, i.since) = (InstanceState::LeaseLost, now);
            self.changes += 1;
        }
        Ok(())
    }

    /// A load report from `XLLM:LOADMETRICS:<name>`. For a name not registered yet it is
    /// kept (up to [`MAX_PENDING_LOADS`] names) and applied when the instance appears.
    pub fn load(&mut self, name: &str, load: LoadMetrics) {
        if let Some(i) = self.instances.get_mut(name) {
            i.load = Some(load);
            i.load_reports += 1;
        } else if self.pending_loads.len() < MAX_PENDING_LOADS
            || self.pending_loads.contains_key(name)
        {
            self.pending_loads.insert(name.to_string(), load);
        }
    }

    /// The LOADMETRICS key of `name` was deleted.
    pub fn load_deleted(&mut self, name: &str) {
        self.pending_loads.remove(name);
    }

    /// Forgets loads kept for names that are not registered (before a re-list refills them).
    pub fn clear_pending_loads(&mut self) {
        self.pending_loads.clear();
    }

    /// Applies the timeouts; returns the names removed.
    pub fn tick(&mut self, now: Instant) -> Vec<String> {
        for i in self.instances.values_mut() {
            if i.state == InstanceState::LeaseLost {
                let last = i.last_heartbeat.map_or(i.since, |h| h.max(i.since));
                if now.saturating_duration_since(last) >= LEASE_LOST_GRACE {
                    (i.state, i.since) = (InstanceState::Suspect, now);
                    self.changes += 1;
                }
            }
        }
        let expired: Vec<String> = self
            .instances
            .values()
            .filter(|i| {
                i.state == InstanceState::Suspect
                    && now.saturating_duration_since(i.since) >= SUSPECT_TIMEOUT
            })
            .map(|i| i.record.name.clone())
            .collect();
        for name in &expired {
            self.instances.remove(name);
            self.changes += 1;
        }
        expired
    }
}
