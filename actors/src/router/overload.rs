//! Overload admission in the router ([`kvdir::overload`]): the front door's first route of a
//! request goes through [`AdmitForward`], which sends it now, holds it in the bounded FIFO, or
//! refuses it. The router owns the queue because it owns what frees an engine up: a request's
//! first byte or end ([`super::RequestProgress`]) and load reports and snapshots
//! ([`super::SetLoad`], [`super::SetCandidates`]) each call [`RouterActor::release_held`], and a
//! timer fires when the oldest held request reaches `--overload_max_wait_ms`. The queue is in
//! the router's state ([`Held`]); the timer is the actor's. With admission off (the default) a
//! request never comes here: its handler decides it ([`super::RouterHandle::forward`]).
//!
//! A released request is routed then, with the hits read when it arrived, and its decision goes
//! to the waiting handler through a oneshot channel. A handler that goes away (its client
//! disconnected) sends [`WithdrawHeld`] from a drop guard; a decision whose receiver is gone
//! is undone (its in-flight count ends).
//!
//! Messages: [`AdmitForward`], [`WithdrawHeld`], [`GetOverload`].

use actix::prelude::*;
use kvdir::car::{route, RequestId, RouteError, Routed};
use kvdir::overload::{
    AdmissionQueue, Arrival, HeldId, OverloadParams, OverloadReport, Refusal, Release,
};
use tokio::sync::oneshot;

use super::{RouteForward, Router, RouterActor};
use crate::directory::now_ms;

/// A forwarded request's decision: the route, its in-flight id and the instance's base URL.
pub type Forwarded = Result<(Routed, RequestId, String), RouteError>;

/// A held request.
pub struct Pending {
    msg: RouteForward,
    tx: oneshot::Sender<Forwarded>,
}

/// The admission queue.
#[derive(Default)]
pub struct Held {
    queue: AdmissionQueue<Pending>,
}

impl Held {
    /// A queue with `params` (off when `params.ttft_bound_ms` is 0).
    pub fn new(params: OverloadParams) -> Self {
        Held { queue: AdmissionQueue::new(params) }
    }

    /// Whether admission is on.
    pub fn enabled(&self) -> bool {
        self.queue.params().enabled()
    }
}

/// What the front door does with a request.
pub enum Admission {
    /// It was routed now.
    Now(Forwarded),
    /// It is held; its decision comes on `rx`. Withdraw `id` if the client goes away.
    Held {
        /// The held request's id.
        id: HeldId,
        /// Its decision, when released.
        rx: oneshot::Receiver<Forwarded>,
    },
    /// The queue is full: answer 429.
    Refused(Refusal),
}

/// Route a request the front door forwards for the first time, through the admission queue.
#[derive(Message)]
#[rtype(result = "Admission")]
pub struct AdmitForward(pub RouteForward);

/// A held request's client went away.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WithdrawHeld(pub HeldId);

/// The admission counters and settings.
#[derive(Message)]
#[rtype(result = "OverloadReport")]
pub struct GetOverload;

impl Handler<AdmitForward> for RouterActor {
    type Result = MessageResult<AdmitForward>;

    fn handle(&mut self, msg: AdmitForward, ctx: &mut Context<Self>) -> Self::Result {
        let (admission, held) = self.router().admit(msg.0);
        if held {
            self.schedule_deadline(ctx);
        }
        MessageResult(admission)
    }
}

impl Handler<WithdrawHeld> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: WithdrawHeld, ctx: &mut Context<Self>) {
        let withdrawn = self.router().held.queue.withdraw(msg.0).is_some();
        if withdrawn {
            self.schedule_deadline(ctx);
        }
    }
}

impl Handler<GetOverload> for RouterActor {
    type Result = MessageResult<GetOverload>;

    fn handle(&mut self, _: GetOverload, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.router().held.queue.report())
    }
}

impl RouterActor {
    /// Sends every held request that may go now, then re-arms the deadline.
    pub(super) fn release_held(&mut self, ctx: &mut Context<Self>) {
        if self.router().release_due() {
            self.schedule_deadline(ctx);
        }
    }

    /// Arms one timer for the oldest held request's deadline (replacing any earlier one).
    fn schedule_deadline(&mut self, ctx: &mut Context<Self>) {
        if let Some(t) = self.timer.take() {
            ctx.cancel_future(t);
        }
        let Some(deadline) = self.router().held.queue.next_deadline_ms() else { return };
        let wait = deadline.saturating_sub(now_ms());
        let after = std::time::Duration::from_millis(wait);
        self.timer = Some(ctx.run_later(after, |act, ctx| {
            act.timer = None;
            act.release_held(ctx);
        }));
    }
}

impl Router {
    /// A request's first route through the queue: the admission, and whether it is held now.
    fn admit(&mut self, msg: RouteForward) -> (Admission, bool) {
        if !self.held.enabled() {
            return (Admission::Now(self.forward(&msg)), false);
        }
        let estimate = self.lowest_estimate(&msg);
        let (tx, rx) = oneshot::channel();
        let now = now_ms();
        match self.held.queue.arrive(now, estimate, Pending { msg, tx }) {
            Arrival::Send(p) => (Admission::Now(self.forward(&p.msg)), false),
            Arrival::Held(id) => {
                tracing::debug!(held = id, estimate_ms = estimate, "request held: overloaded");
                (Admission::Held { id, rx }, true)
            }
            Arrival::Refused(_, refusal) => (Admission::Refused(refusal), false),
        }
    }

    /// Sends every held request that may go now, oldest first, one at a time (each released
    /// request counts in flight before the next is estimated). False when none was held.
    fn release_due(&mut self) -> bool {
        if self.held.queue.is_empty() {
            return false;
        }
        self.held.queue.withdraw_where(|p| p.tx.is_closed());
        let now = now_ms();
        while let Some(head) = self.held.queue.head() {
            let estimate = self.lowest_estimate(&head.msg);
            let Some((p, why)) = self.held.queue.pop_due(now, estimate) else { break };
            if why == Release::MaxWait {
                tracing::debug!(estimate_ms = estimate, "held request sent after its max wait");
            }
            let decision = self.forward(&p.msg);
            if let Err(Ok((routed, id, _))) = p.tx.send(decision) {
                // The client went away after the release: nothing will be sent.
                self.finish(&routed.prefill, id);
            }
        }
        true
    }
    /// The lowest estimated time to first token of `msg` over the candidates it may go to:
    /// the TTFT policy's estimate (`estimated_ttft_ms` of every eligible prefill candidate,
    /// computed under every policy), from a decision with the front door's settings on a copy
    /// of the tie rotation that is neither recorded nor counted. `None` when no candidate can take it (routing then
    /// answers why).
    fn lowest_estimate(&self, msg: &RouteForward) -> Option<f64> {
        let prompt = Some(msg.prompt).filter(|_| self.predicting(self.front.policy));
        let mut cands = Vec::new();
        let listed = self.listed(&msg.read);
        let request = (msg.input_tokens, prompt, now_ms());
        self.candidates(&msg.read, &listed, request, &mut cands);
        cands.retain(|c| !msg.exclude.contains(&c.name));
        let mut rotation = self.rotation;
        let routed = route(&cands, msg.input_tokens, &self.front, &mut rotation).ok()?;
        routed.candidates.iter().filter_map(|c| c.estimated_ttft_ms).reduce(f64::min)
    }
}
