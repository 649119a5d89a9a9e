//! `StreamActor`: supervises one subscription's worker and answers status requests.
//!
//! Messages: [`GetStreamReport`]; internally `WorkerExited`.
//! The actor adds its worker (sockets, decoding, recovery) to the I/O pool ([`IoPool`]) and
//! stops itself when the worker fails; its `Supervisor` then restarts it after a back-off,
//! which adds a fresh worker. Stopping the actor removes the worker from its pool thread, which
//! closes its sockets at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use kvdir::backoff::Backoff;
use kvdir::config::ReplayKind;
use kvdir::stream::{StreamFault, StreamPhase};
use serde::Serialize;

use super::pool::{IoPool, NewStream, StreamTicket};
use super::worker::{WorkerCtx, WorkerStatus};
use super::Shutdown;
use super::{IndexActor, Invalidate, StreamSource};
use crate::sync::lock;

static WORKER_IDS: AtomicU64 = AtomicU64::new(0);

/// What a stream reports on the streams endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// Instance name.
    pub instance_name: String,
    /// DP rank.
    pub dp_rank: u32,
    /// Where the stream comes from, and the engine process it was started for.
    #[serde(flatten)]
    pub origin: StreamOrigin,
    /// The model it serves; empty: unnamed.
    pub model: String,
    /// Live endpoint.
    pub endpoint: String,
    /// Snapshot or history endpoint.
    pub replay_endpoint: String,
    /// What the replay endpoint answers: `snapshot` (xLLM) or `history` (vLLM, SGLang).
    pub replay: ReplayKind,
    /// The worker's status: phase, connection, counters, last fault.
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// Worker restarts by the supervisor.
    pub restarts: u64,
    /// The wait before the last restart, in ms (it doubles per restart, up to 6.4 s).
    pub restart_backoff_ms: Option<u64>,
}

/// Where a stream comes from, fixed when it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamOrigin {
    /// `static`, `discovery`, `register` or `engine`.
    pub source: StreamSource,
    /// The engine process it was started for (its incarnation id: xLLM's, or a listed
    /// engine's identity); absent for streams without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// Ask a stream for its report.
#[derive(Message)]
#[rtype(result = "StreamReport")]
pub struct GetStreamReport;

#[derive(Message)]
#[rtype(result = "()")]
struct WorkerExited(String);

/// One supervised subscription.
pub struct StreamActor {
    /// What each worker it starts is given; its `status` is this stream's, across workers.
    worker: WorkerCtx,
    origin: StreamOrigin,
    index: Addr<IndexActor>,
    /// The current worker in the pool; `None` before the first worker starts.
    ticket: Option<StreamTicket>,
    pool: IoPool,
    restarts: u64,
    backoff: Option<Duration>,
    /// Delays between restarts: 200 ms, doubling, at most 6.4 s.
    restart_delay: Backoff,
}

impl StreamActor {
    /// A stream whose workers (on `pool`) write `worker.shared`'s writer, owned by `index`.
    pub fn new(
        worker: WorkerCtx,
        origin: StreamOrigin,
        index: Addr<IndexActor>,
        pool: IoPool,
    ) -> Self {
        StreamActor {
            worker,
            origin,
            index,
            ticket: None,
            pool,
            restarts: 0,
            backoff: None,
            restart_delay: Backoff::new(Duration::from_millis(200), Duration::from_millis(6400)),
        }
    }

    fn spawn_worker(&mut self, ctx: &mut Context<Self>) {
        let wctx = self.worker.clone();
        let me = ctx.address().downgrade();
        // A failure (a socket error or a panic) must not end the stream silently: the actor
        // is told and restarts it.
        let exited = Box::new(move |reason: String| {
            if let Some(me) = me.upgrade() {
                me.do_send(WorkerExited(reason));
            }
        });
        let id = WORKER_IDS.fetch_add(1, Ordering::Relaxed);
        self.ticket = Some(self.pool.add(id, NewStream { ctx: wctx, exited }));
    }

    fn stop_worker(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.pool.remove(ticket);
        }
    }
}

impl Actor for StreamActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.spawn_worker(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stop_worker();
    }
}

impl Supervised for StreamActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.stop_worker();
        self.restarts += 1;
        lock(&self.worker.status).phase = StreamPhase::Disconnected;
    }
}

impl Handler<WorkerExited> for StreamActor {
    type Result = ();

    fn handle(&mut self, msg: WorkerExited, ctx: &mut Context<Self>) {
        let spec = &self.worker.spec;
        tracing::error!(stream = %spec.instance_name, dp = spec.dp_rank, error = %msg.0, "stream worker failed; restarting");
        // No credit while no worker follows the publisher.
        let fault = StreamFault::WorkerFailed(msg.0);
        let last_fault = fault.to_string();
        self.index.do_send(Invalidate { fault });
        let delay = self.restart_delay.next_delay();
        self.backoff = Some(delay);
        {
            let mut s = lock(&self.worker.status);
            s.phase = StreamPhase::Backoff;
            s.connected = false;
            s.last_fault = Some(last_fault);
        }
        ctx.run_later(delay, |_, ctx| ctx.stop());
    }
}

impl Handler<Shutdown> for StreamActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) {
        self.stop_worker();
    }
}

impl Handler<GetStreamReport> for StreamActor {
    type Result = MessageResult<GetStreamReport>;

    fn handle(&mut self, _: GetStreamReport, _: &mut Context<Self>) -> Self::Result {
        let mut status = lock(&self.worker.status).clone();
        let (spec, shared) = (&self.worker.spec, &self.worker.shared);
        status.skipped_events += shared.skipped_out_of_scope.load(Ordering::Relaxed);
        MessageResult(StreamReport {
            instance_name: spec.instance_name.clone(),
            dp_rank: spec.dp_rank,
            origin: self.origin.clone(),
            model: spec.model.clone(),
            endpoint: spec.endpoint.clone(),
            replay_endpoint: spec.replay_endpoint.clone(),
            replay: spec.replay,
            status,
            restarts: self.restarts,
            restart_backoff_ms: self.backoff.map(|d| d.as_millis() as u64),
        })
    }
}
