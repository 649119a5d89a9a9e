//! The front door's side of overload admission (`--overload_ttft_ms`, see
//! [`kvdir::overload`] and the router's `overload.rs`): a request's first route waits while it
//! is held, a client that goes away while held leaves the queue (a drop guard withdraws it: actix
//! drops the handler's future when the connection closes), and a refusal becomes a 429
//! ([`FrontError::Overloaded`]). Also renders the `kvdir_frontend_overload_*` families.

use actix::Addr;
use actix_web::web;
use kvdir::metrics::{Exposition, Kind};
use kvdir::overload::{HeldId, OverloadReport, Refusal};

use super::FrontError;
use crate::http::AppState;
use crate::router::{Admission, AdmitForward, Forwarded, RouteForward, RouterActor, WithdrawHeld};

/// Routes `msg`: on this thread when admission is off or on a retry (it was admitted once
/// already), else through the router actor's admission queue.
pub async fn route(
    state: &web::Data<AppState>,
    msg: RouteForward,
    first: bool,
) -> Result<Forwarded, FrontError> {
    if !first || !state.route.admission() {
        return Ok(state.route.forward(msg));
    }
    match state.router.send(AdmitForward(msg)).await? {
        Admission::Now(decision) => Ok(decision),
        Admission::Refused(refusal) => Err(FrontError::Overloaded(refusal)),
        Admission::Held { id, rx } => {
            let guard = Withdraw { router: state.router.clone(), id: Some(id) };
            let decision = rx.await.map_err(|_| {
                FrontError::Internal("the router stopped while the request was held".into())
            });
            guard.disarm();
            decision
        }
    }
}

/// Withdraws a held request when dropped before its decision came.
struct Withdraw {
    router: Addr<RouterActor>,
    id: Option<HeldId>,
}

impl Withdraw {
    fn disarm(mut self) {
        self.id = None;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.router.do_send(WithdrawHeld(id));
        }
    }
}

/// The 429's message: what is overloaded and which settings change it.
pub fn refusal_message(r: &Refusal) -> String {
    format!(
        "every engine is overloaded: this request's lowest estimated time to first token is \
         {:.0} ms, above --overload_ttft_ms = {}, and the overload queue is full \
         (--overload_queue = {} requests held); retry after {} s, or raise --overload_queue to \
         hold more requests",
        r.estimate_ms, r.params.ttft_bound_ms, r.params.queue, r.retry_after_s
    )
}

/// Appends the `kvdir_frontend_overload_*` families.
pub fn render(e: &mut Exposition, report: OverloadReport) {
    let (c, params) = (report.counters, report.params);
    let name = "kvdir_frontend_overload_held_total";
    let help = "Front door requests held on arrival: every engine's estimated TTFT above \
                --overload_ttft_ms.";
    e.family(name, Kind::Counter, help);
    e.sample(name, &[], c.held as f64);
    let name = "kvdir_frontend_overload_released_total";
    let help = "Held requests sent, by reason: capacity (an estimate came within the bound) or \
                max_wait (sent anyway after --overload_max_wait_ms).";
    e.family(name, Kind::Counter, help);
    e.sample(name, &[("reason", "capacity")], c.released_capacity as f64);
    e.sample(name, &[("reason", "max_wait")], c.released_max_wait as f64);
    let name = "kvdir_frontend_overload_withdrawn_total";
    e.family(name, Kind::Counter, "Held requests whose client went away.");
    e.sample(name, &[], c.withdrawn as f64);
    let name = "kvdir_frontend_overload_refused_total";
    e.family(name, Kind::Counter, "Requests refused with 429: the overload queue was full.");
    e.sample(name, &[], c.refused as f64);
    let name = "kvdir_frontend_overload_queue_length";
    e.family(name, Kind::Gauge, "Front door requests held now.");
    e.sample(name, &[], c.queue_length as f64);
    let name = "kvdir_frontend_overload_ttft_bound_seconds";
    e.family(name, Kind::Gauge, "--overload_ttft_ms in seconds; 0: overload admission is off.");
    e.sample(name, &[], params.ttft_bound_ms as f64 / 1000.0);
}
