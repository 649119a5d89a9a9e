//! [`RouterActor`]: the router's messages, on the router's own arbiter. It holds the same
//! [`RouterHandle`] as the request handlers and takes its lock for each message; it is the
//! only place with a timer, which overload admission's held requests need (`overload.rs`).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use kvdir::car::{Policy, RouteError, RouteParams, Routed};

use super::{
    GetPredictCounters, GetRecentRoutes, RequestProgress, RouteForward, RouteRequest, Router,
    RouterHandle, SetCandidates, SetLoad, SetLoads,
};
use crate::directory::Directory;

/// The router's messages (see the module documentation).
pub struct RouterActor {
    router: RouterHandle,
    /// The timer of the oldest held request's deadline (overload admission).
    pub(super) timer: Option<SpawnHandle>,
}

impl Actor for RouterActor {
    type Context = Context<Self>;
}

impl RouterActor {
    /// A router over `directory` deciding with `params`, and with `front_policy` for the front
    /// door.
    pub fn new(directory: Arc<Directory>, params: RouteParams, front_policy: Policy) -> Self {
        let state = Arc::new(Mutex::new(Router::new(directory, params, front_policy)));
        RouterActor { router: RouterHandle { state, admission: false }, timer: None }
    }

    /// This router with overload admission (`--overload_*`).
    pub fn with_overload(mut self, params: kvdir::overload::OverloadParams) -> Self {
        let held = super::overload::Held::new(params);
        self.router.admission = held.enabled();
        self.router.lock().held = held;
        self
    }

    /// The router's state, for handlers that decide on their own thread.
    pub fn shared(&self) -> RouterHandle {
        self.router.clone()
    }

    /// The router, locked.
    pub(super) fn router(&self) -> std::sync::MutexGuard<'_, Router> {
        self.router.lock()
    }
}

impl Handler<SetCandidates> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: SetCandidates, ctx: &mut Context<Self>) {
        self.router().set_candidates(msg.0);
        self.release_held(ctx);
    }
}

impl Handler<SetLoad> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: SetLoad, ctx: &mut Context<Self>) {
        self.router().set_load(msg);
        self.release_held(ctx);
    }
}

impl Handler<SetLoads> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: SetLoads, ctx: &mut Context<Self>) {
        let mut router = self.router();
        for load in msg.0 {
            router.set_load(load);
        }
        drop(router);
        self.release_held(ctx);
    }
}

/// Release the held requests that may go now: the router's state changed outside the actor
/// ([`super::RouterLink`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ReleaseHeld;

impl Handler<ReleaseHeld> for RouterActor {
    type Result = ();

    fn handle(&mut self, _: ReleaseHeld, ctx: &mut Context<Self>) {
        self.release_held(ctx);
    }
}

impl Handler<RouteRequest> for RouterActor {
    type Result = Result<Routed, RouteError>;

    fn handle(&mut self, msg: RouteRequest, _: &mut Context<Self>) -> Self::Result {
        self.router().route(&msg)
    }
}

impl Handler<RouteForward> for RouterActor {
    type Result = super::Forwarded;

    fn handle(&mut self, msg: RouteForward, _: &mut Context<Self>) -> Self::Result {
        self.router().forward(&msg)
    }
}

impl Handler<RequestProgress> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: RequestProgress, ctx: &mut Context<Self>) {
        self.router().progress(msg);
        self.release_held(ctx);
    }
}

impl Handler<GetPredictCounters> for RouterActor {
    type Result = MessageResult<GetPredictCounters>;

    fn handle(&mut self, _: GetPredictCounters, _: &mut Context<Self>) -> Self::Result {
        let router = self.router();
        MessageResult((router.predictions.counters(), router.predictions.len()))
    }
}

impl Handler<GetRecentRoutes> for RouterActor {
    type Result = MessageResult<GetRecentRoutes>;

    fn handle(&mut self, _: GetRecentRoutes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.router().recent.report())
    }
}

/// Milliseconds since the Unix epoch (the recent decisions' clock).
pub(super) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
