//! Routing decisions from the hits a request's handler read from the [`Directory`] and the
//! instance snapshot that discovery pushes. The [`Router`] is given the directory when it is
//! made, and credits the engines without KV events there with what it routes.
//!
//! The router's state is what must be serialized: the instance snapshot, the tie rotation, the
//! front door's requests in flight ([`InFlight`], added to each instance's reported queue until
//! its next load report), the content keys it expects on instances it recently chose
//! ([`Predictions`], predict-on-route, see `predict.rs`) and the last decisions
//! ([`RecentRoutes`], the last 20, token counts only) for the status page, the prefill
//! work routed to each instance and not done yet ([`WorkLedger`], the TTFT estimate's queue,
//! see `work.rs`). Engines without KV events are credited from its decisions
//! ([`Directory::approximate`]).
//!
//! That state sits behind one mutex ([`RouterHandle`]): a request's handler reads the directory
//! itself and takes the lock to decide, on its own thread, with no mailbox between it and the
//! decision (under load, a hop to the router's thread cost a wait for that thread to get a
//! CPU; design.md "Routing on the handler's thread"). Discovery applies its snapshots and
//! loads under the same lock ([`RouterLink`]), so the next decision sees them. [`RouterActor`]
//! (`actor.rs`) holds the same handle for what arrives as messages: [`GetRecentRoutes`],
//! [`GetPredictCounters`], the front door's [`RequestProgress`], overload admission's
//! (`overload.rs`), whose held requests need the actor's timer, and [`SetCandidates`] and
//! [`SetLoad`] from the demo and the benches.

mod actor;
mod candidates;
mod ids;
mod overload;
mod predict;
mod work;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::prelude::*;
use kvdir::car::{
    route_listed, route_pruned, Candidate, DpRouting, InFlight, InstanceId, NameMap, Policy,
    PredictCounters, Predictions, PromptId, RankLoad, RecentRoutes, RecentRoutesReport, RequestId,
    Rotation, RouteError, RouteParams, Routed, WorkLedger,
};
use kvdir::registry::{Identity, InstanceState, LoadMetrics};

use crate::directory::{now_ms, Directory, RouteRead};
pub use actor::RouterActor;
pub use overload::{Admission, AdmitForward, Forwarded, GetOverload, WithdrawHeld};

/// One instance for routing, with its current identity.
#[derive(Debug, Clone)]
pub struct InstanceInfo {
    /// Everything routing needs except the request's hits.
    pub candidate: Candidate,
    /// The process registered now.
    pub identity: Identity,
    /// Load reports received from that process so far.
    pub load_reports: u64,
    /// Where the front door forwards: the engine's base URL (listed engines), or `None` for
    /// `http://<name>` (registered xLLM instances, whose name is their HTTP `host:port`).
    pub url: Option<String>,
}

/// The base URL requests for instance `name` go to: a listed engine's own `url`, else
/// `http://<name>`.
fn base_url(name: &str, url: Option<&str>) -> String {
    url.map_or_else(|| format!("http://{name}"), str::to_string)
}

/// Replace the instance snapshot (from discovery).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetCandidates(pub Vec<InstanceInfo>);

/// One instance's fresh load report, state and report count (from discovery, on a
/// heartbeat): applied in place, so a heartbeat costs the same in a fleet of any size instead of
/// a whole snapshot of every instance.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetLoad {
    /// Instance name.
    pub name: String,
    /// Its latest load.
    pub load: Option<LoadMetrics>,
    /// Its state.
    pub state: InstanceState,
    /// Load reports received from its process so far.
    pub load_reports: u64,
    /// Its load per DP rank, where it reports one.
    pub rank_loads: Vec<RankLoad>,
}

/// Several instances' loads at once (the heartbeats discovery applied in one pass).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetLoads(pub Vec<SetLoad>);

/// Choose instances for a tokenized request.
#[derive(Message)]
#[rtype(result = "Result<Routed, RouteError>")]
pub struct RouteRequest {
    /// Tokens in the prompt.
    pub input_tokens: usize,
    /// The streams' hits for the prompt ([`Directory::read_route`]).
    pub read: RouteRead,
}

/// Choose an instance for a request the front door forwards, leaving out `exclude` (instances
/// that already failed it), and count it in flight there from now on. Answers the decision, the
/// request's in-flight id and the chosen instance's base URL.
#[derive(Message)]
#[rtype(result = "Result<(Routed, RequestId, String), RouteError>")]
pub struct RouteForward {
    /// Tokens in the prompt.
    pub input_tokens: usize,
    /// The streams' hits for the prompt ([`Directory::read_route`]).
    pub read: RouteRead,
    /// Instances not to choose.
    pub exclude: Vec<String>,
    /// The prompt ([`kvdir::car::prompt_id`]): its in-flight siblings are not its queue when
    /// predicting.
    pub prompt: PromptId,
    /// The DP rank the client named itself (`X-data-parallel-rank`), if any: where the engine
    /// takes a rank, it is the one scored and credited.
    pub pinned_rank: Option<u32>,
}

/// A forwarded request's progress.
#[derive(Message)]
#[rtype(result = "()")]
pub enum RequestProgress {
    /// The engine's first byte arrived: the request is past its queue and prefill.
    FirstByte(String, RequestId, Answer),
    /// The request ended (answered, failed or cancelled).
    Finished(String, RequestId),
}

/// How an answer comes back, which says what its first byte measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Server-sent events: the first byte comes with the first token, so its time is the
    /// request's TTFT and teaches the engine's prefill rate.
    Streamed,
    /// One JSON body: the first byte comes after the whole decode, so it ends the request's
    /// prefill but teaches nothing.
    Whole,
}

/// The latest routing decisions, newest first.
#[derive(Message)]
#[rtype(result = "RecentRoutesReport")]
pub struct GetRecentRoutes;

/// Ask for predict-on-route's counters and how many predictions are kept now.
#[derive(Message)]
#[rtype(result = "(PredictCounters, usize)")]
pub struct GetPredictCounters;

/// The router's state (see the module documentation), behind [`RouterHandle`]'s lock.
pub struct Router {
    /// The directory: read by the handlers, credited here for engines without KV events.
    directory: Arc<Directory>,
    instances: Vec<InstanceInfo>,
    /// Position of each instance in `instances`, by name.
    positions: NameMap<String, usize>,
    /// Each instance's handle in the directory ([`crate::directory::Handles`]), by position.
    handles: Vec<u32>,
    /// Position of each instance, by its handle (`usize::MAX`: none).
    by_handle: Vec<usize>,
    /// Each instance's id, which keys the in-flight requests, predictions and work (`ids.rs`).
    ids: ids::Ids,
    /// `/v1/internal/route`'s settings (`--load_balance_policy`).
    params: RouteParams,
    /// The front door's: the same with its own policy (`--frontend_policy`).
    front: RouteParams,
    rotation: Rotation,
    recent: RecentRoutes,
    inflight: InFlight<InstanceId>,
    predictions: Predictions<InstanceId>,
    /// Prefill work routed and not done yet, per instance (the TTFT estimate's queue).
    ledger: WorkLedger<InstanceId>,
    /// Overload admission: held requests (`overload.rs`).
    held: overload::Held,
    /// The candidates of the last decision, whose buffers the next one reuses.
    scratch: Vec<Candidate>,
}

/// The router's state, shared by the request handlers (which decide on their own thread) and
/// [`RouterActor`]; cheap to clone.
#[derive(Clone)]
pub struct RouterHandle {
    state: Arc<Mutex<Router>>,
    /// Whether overload admission is on (set at start, never changed).
    admission: bool,
}

impl RouterHandle {
    /// The router, locked. A panic while deciding leaves its state whole (each structure is
    /// updated in one step), so a poisoned lock is still used (`crate::sync`).
    fn lock(&self) -> MutexGuard<'_, Router> {
        crate::sync::lock(&self.state)
    }

    /// Decides `/v1/internal/route`'s request on this thread; answers too how long it waited
    /// for the lock.
    pub fn route(&self, msg: RouteRequest) -> (Result<Routed, RouteError>, Duration) {
        let asked = Instant::now();
        let mut router = self.lock();
        let waited = asked.elapsed();
        let routed = router.route(&msg);
        // The read's entries (thousands in a large fleet) are dropped after the lock is
        // released, not under it.
        drop(router);
        drop(msg);
        (routed, waited)
    }

    /// Whether a request the front door forwards for the first time goes through overload
    /// admission ([`AdmitForward`], the actor's queue) rather than [`Self::forward`].
    pub fn admission(&self) -> bool {
        self.admission
    }

    /// Decides a request the front door forwards on this thread (a retry, or a first attempt
    /// while overload admission is off), counted in flight on the chosen instance.
    pub fn forward(&self, msg: RouteForward) -> Forwarded {
        let forwarded = self.lock().forward(&msg);
        drop(msg);
        forwarded
    }
}

/// The router as discovery holds it: a snapshot or a load is applied to the router's state
/// at once, so the next decision sees it, as the instance listing does (a message to the actor
/// could still be queued when a handler decides); the actor is then told, for overload
/// admission's held requests.
#[derive(Clone)]
pub struct RouterLink {
    addr: Addr<RouterActor>,
    shared: RouterHandle,
}

impl RouterLink {
    /// The actor `addr` and its state `shared` ([`RouterActor::shared`]).
    pub fn new(addr: Addr<RouterActor>, shared: RouterHandle) -> Self {
        RouterLink { addr, shared }
    }

    /// Replaces the instance snapshot.
    pub fn set_candidates(&self, instances: Vec<InstanceInfo>) {
        let mut router = self.shared.lock();
        router.set_candidates(instances);
        self.release(router);
    }

    /// Applies instances' fresh loads.
    pub fn set_loads(&self, loads: Vec<SetLoad>) {
        let mut router = self.shared.lock();
        for load in loads {
            router.set_load(load);
        }
        self.release(router);
    }

    /// Has the actor release the held requests that may go now (admission on only).
    fn release(&self, router: MutexGuard<'_, Router>) {
        let held = router.held.enabled();
        drop(router);
        if held {
            self.addr.do_send(actor::ReleaseHeld);
        }
    }
}

impl Router {
    /// A router over `directory` deciding with `params`, and with `front_policy` for the front
    /// door.
    pub fn new(directory: Arc<Directory>, params: RouteParams, front_policy: Policy) -> Self {
        let capacity = Predictions::<InstanceId>::DEFAULT_CAPACITY;
        let predictions = Predictions::new(params.predict_ttl_ms, capacity);
        let front = RouteParams { policy: front_policy, ..params.clone() };
        Router {
            directory,
            instances: Vec::new(),
            positions: NameMap::default(),
            handles: Vec::new(),
            by_handle: Vec::new(),
            ids: ids::Ids::default(),
            params,
            front,
            rotation: Rotation::default(),
            recent: RecentRoutes::default(),
            inflight: InFlight::default(),
            predictions,
            ledger: WorkLedger::default(),
            held: overload::Held::default(),
            scratch: Vec::new(),
        }
    }

    /// Replaces the instance snapshot.
    /// The state of the instances that left is cleared before their ids are given again.
    fn set_candidates(&mut self, instances: Vec<InstanceInfo>) {
        self.instances = instances;
        self.positions.clear();
        self.handles.clear();
        self.by_handle.iter_mut().for_each(|p| *p = usize::MAX);
        for (i, info) in self.instances.iter().enumerate() {
            self.positions.insert(info.candidate.name.clone(), i);
            let h = self.directory.instance_handle(&info.candidate.name);
            self.handles.push(h);
            if self.by_handle.len() <= h as usize {
                self.by_handle.resize(h as usize + 1, usize::MAX);
            }
            self.by_handle[h as usize] = i;
        }
        let gone = self.ids.assign(self.instances.iter().map(|i| i.candidate.name.as_str()));
        for id in &gone {
            self.inflight.forget_instance(id);
            self.predictions.forget(id);
        }
        work::snapshot(&mut self.ledger, &self.instances, &self.ids);
        self.ids.release(gone);
    }

    fn set_load(&mut self, msg: SetLoad) {
        // Discovery sends every instance in a snapshot before any heartbeat of it, so a miss
        // is an instance removed since; its next snapshot has left it out.
        let Some(&i) = self.positions.get(&msg.name) else { return };
        let info = &mut self.instances[i];
        (info.candidate.load, info.candidate.state) = (msg.load, msg.state);
        info.candidate.rank_loads = msg.rank_loads;
        info.load_reports = msg.load_reports;
        work::report(&mut self.ledger, info, self.ids.at(i));
    }

    /// `/v1/internal/route`'s decision.
    fn route(&mut self, msg: &RouteRequest) -> Result<Routed, RouteError> {
        let routed = self.decide(&msg.read, msg.input_tokens, &[], (None, None))?;
        if let Some((i, id)) = self.chosen(&routed) {
            let reports = self.instances[i].load_reports;
            work::record(&mut self.ledger, &routed, (id, reports), None);
        }
        Ok(routed)
    }

    /// The front door's decision, counted in flight on the chosen instance.
    fn forward(&mut self, msg: &RouteForward) -> Forwarded {
        let request = (Some(msg.prompt), msg.pinned_rank);
        let routed = self.decide(&msg.read, msg.input_tokens, &msg.exclude, request)?;
        // The chosen instance is in the snapshot: the decision chose it there.
        let (i, instance) = self.chosen(&routed).expect("the chosen instance is known");
        let info = &self.instances[i];
        let reports = info.load_reports;
        let url = base_url(&routed.prefill, info.url.as_deref());
        let id = self.inflight.start(&instance, reports, Some(msg.prompt));
        work::record(&mut self.ledger, &routed, (instance, reports), Some(id));
        Ok((routed, id, url))
    }

    /// A forwarded request's progress.
    fn progress(&mut self, msg: RequestProgress) {
        match msg {
            RequestProgress::FirstByte(instance, id, answer) => {
                // An instance no longer known counts nothing any more (`ids.rs`).
                let Some(instance) = self.ids.of(&instance) else { return };
                self.inflight.first_byte(&instance, id);
                match answer {
                    Answer::Streamed => self.ledger.first_byte(&instance, id, now_ms()),
                    Answer::Whole => self.ledger.forget(&instance, id),
                }
            }
            RequestProgress::Finished(instance, id) => self.finish(&instance, id),
        }
    }

    /// Whether routed requests' keys are predicted under `policy` (CAR or TTFT with
    /// `--car_predict_ttl_ms` > 0).
    fn predicting(&self, policy: Policy) -> bool {
        self.predictions.enabled() && matches!(policy, Policy::Car | Policy::Ttft)
    }

    /// The front door's request `id` to `instance` ended: it is neither in flight nor queued
    /// work there any more.
    fn finish(&mut self, instance: &str, id: RequestId) {
        let Some(instance) = self.ids.of(instance) else { return };
        self.inflight.finish(&instance, id);
        self.ledger.forget(&instance, id);
    }

    /// The position and id of the decision's prefill instance.
    fn chosen(&self, routed: &Routed) -> Option<(usize, InstanceId)> {
        let i = *self.positions.get(&routed.prefill)?;
        Some((i, self.ids.at(i)))
    }

    /// Routes over the candidates not in `exclude` and records the decision (and, when
    /// predicting, the chosen instance's expected keys). A request with a `prompt` id is the
    /// front door's and is routed with its policy; a `pinned` rank is the client's own. A
    /// read of the streams with credit alone (a large fleet) gives a compact answer, whose
    /// listed candidates get their other ranks from the directory.
    fn decide(
        &mut self,
        read: &RouteRead,
        input_tokens: usize,
        exclude: &[String],
        (prompt, pinned): (Option<PromptId>, Option<u32>),
    ) -> Result<Routed, RouteError> {
        let now_ms = now_ms();
        let params = match prompt {
            Some(_) => self.front.clone(),
            None => self.params.clone(),
        };
        let predicting = self.predicting(params.policy);
        let listed = self.listed(read);
        if predicting {
            let (ids, handles) = (&self.ids, &self.handles);
            let entries = |id| ids.position(id).map_or(&[][..], |i| read.of(handles[i]));
            predict::confirm(&mut self.predictions, entries);
        }
        let prompt = prompt.filter(|_| predicting);
        let request = (input_tokens, prompt, now_ms);
        let compact = !read.complete;
        let mut rotation = self.rotation;
        let pruned = match compact && matches!(params.policy, Policy::Car | Policy::Ttft) {
            true => {
                let (request, exclusion) = ((read, &listed[..], request), (exclude, pinned));
                self.decide_pruned(request, exclusion, &params, &mut rotation)
            }
            false => None,
        };
        let mut routed = match pruned {
            Some(routed) => {
                #[cfg(debug_assertions)]
                {
                    let request = (read, &listed[..], request);
                    let full = self.decide_full(request, (exclude, pinned), &params);
                    assert_eq!((&full, self.rotation), (&routed, rotation), "pruned as full");
                }
                self.rotation = rotation;
                routed
            }
            None => self.decide_full((read, &listed, request), (exclude, pinned), &params),
        };
        if let Ok(r) = &mut routed {
            let chosen = self.instance_hits(read, &r.prefill);
            if let Some(id) = self.ids.of(&r.prefill).filter(|_| predicting) {
                predict::record(&mut self.predictions, now_ms, &id, &chosen);
            }
            self.directory.approximate().record(now_ms, &r.prefill, &chosen);
            if compact {
                self.complete_reports(r, read, input_tokens);
            }
        }
        self.recent.record(actor::unix_ms(), input_tokens, &routed);
        routed
    }

    /// The decision over every instance's candidate ([`Self::decide`]).
    fn decide_full(
        &mut self,
        (read, listed, request): Request<'_>,
        (exclude, pinned): (&[String], Option<u32>),
        params: &RouteParams,
    ) -> Result<Routed, RouteError> {
        let mut cands = std::mem::take(&mut self.scratch);
        self.candidates(read, listed, request, &mut cands);
        cands.retain(|c| !exclude.contains(&c.name));
        pin(&mut cands, pinned);
        let compact = !read.complete;
        let routed = route_listed(&cands, request.0, params, &mut self.rotation, compact);
        self.scratch = cands;
        routed
    }

    /// A compact decision that builds only the candidates of the instances with a part of the
    /// prompt ([`kvdir::car::route_pruned`], whose documentation says why it decides as
    /// [`Self::decide_full`]), turning `rotation`; `None` where it does not apply.
    fn decide_pruned(
        &self,
        (read, listed, request): Request<'_>,
        (exclude, pinned): (&[String], Option<u32>),
        params: &RouteParams,
        rotation: &mut Rotation,
    ) -> Option<Result<Routed, RouteError>> {
        let mut excluded: Vec<usize> =
            exclude.iter().filter_map(|name| self.positions.get(name).copied()).collect();
        excluded.sort_unstable();
        excluded.dedup();
        let mut credited = self.credited(read, listed, request, &excluded);
        pin(credited.iter_mut().map(|(_, c)| c), pinned);
        let plain = candidates::Plain(self, read, request, pinned);
        route_pruned(&plain, &credited, &excluded, request.0, params, rotation)
    }
}

/// A request to decide: the read, the position of each instance it lists
/// ([`Router::listed`]), and its input tokens, prompt (when predicting) and time.
type Request<'a> = (&'a RouteRead, &'a [Option<usize>], (usize, Option<PromptId>, u64));

/// Where kvdir chooses the DP rank, the rank the client `pinned`, if any.
fn pin<'a>(cands: impl IntoIterator<Item = &'a mut Candidate>, pinned: Option<u32>) {
    for c in cands.into_iter().filter(|c| c.dp_routing != DpRouting::Engine) {
        c.dp_routing = pinned.map_or(DpRouting::Kvdir, DpRouting::Pinned);
    }
}
