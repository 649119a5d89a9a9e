//! The thread of one stream: a SUB socket for live events, a socket monitor for handshakes and
//! disconnects, and a fresh DEALER per snapshot request, polled together with `zmq_poll`.
//!
//! The thread decodes frames, drives the pure [`Recovery`] machine and carries out its actions
//! itself: it is the single writer of its stream's state in the shared index (the writer lives
//! in [`StreamShared`], owned by the stream's `IndexActor`). Everything a poll applied is
//! published once at its end, so a burst of live batches costs one publish, and an index error
//! goes straight back into the recovery machine. Snapshots are built and installed here too.
//! A thread that cannot keep up leaves messages in the SUB socket's queue; beyond its
//! high-water mark libzmq drops them, which the next sequence number reveals as a gap. It runs
//! until its stop flag is set or the writer is gone; an idle stream sleeps in `zmq_poll` until
//! a message, a recovery deadline or a stop ([`Stop`]) wakes it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvdir::config::{Limits, ReplayKind, StreamSpec};
use kvdir::stream::{Action, Recovery, RecoveryConfig, RecoveryStats, StreamFault, StreamPhase};
use kvdir::wire::{
    decode_history_frame, decode_live, decode_snapshot_frame, Batch, HistoryFrame, SnapshotFrame,
};
use serde::Serialize;

use super::StreamShared;
use crate::faults::{self, FaultPoint};
use crate::sync::lock;

mod stop;
mod writes;
pub use stop::{Stop, StopListener};

/// Live messages read per poll before timers are looked at again.
const MAX_BURST: usize = 256;
/// Receive high-water mark of the SUB socket, in messages.
const SUB_HWM: i32 = 100_000;

/// What the worker reports about itself: the stream's status, flattened into its report on
/// the streams endpoint (and read by `/metrics`), so each field is defined once.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkerStatus {
    /// `disconnected`, `syncing`, `live`, `resyncing`, `partial` or `backoff`.
    pub phase: StreamPhase,
    /// Whether the SUB socket has completed its ZMTP handshake with the publisher.
    pub connected: bool,
    /// Recovery counters: `gaps`, `recoveries`, `snapshot_failures`, `dropped_batches`,
    /// `full_state_restores`, and for history replay `truncated_histories`,
    /// `replayed_batches` and `duplicate_batches`.
    #[serde(flatten)]
    pub stats: RecoveryStats,
    /// Live messages received.
    pub messages: u64,
    /// Live messages that failed to decode.
    pub decode_errors: u64,
    /// Snapshot payload bytes received.
    pub snapshot_bytes: u64,
    /// Events skipped as out of scope: by the decoder (unknown types, media, multimodal or
    /// salt context) and, in the report, by the index too (stores chaining to or replicating
    /// those blocks).
    pub skipped_events: u64,
    /// The last fault, for operators.
    pub last_fault: Option<String>,
}

/// Everything a worker thread needs.
pub struct WorkerCtx {
    /// The stream.
    pub spec: StreamSpec,
    /// Limits.
    pub limits: Limits,
    /// The stream's writer and counters, shared with its actors.
    pub shared: Arc<StreamShared>,
    /// Set to end the thread; setting it wakes the thread.
    pub stop: Arc<Stop>,
    /// The thread's end of [`WorkerCtx::stop`]'s wake-up.
    pub stop_listener: StopListener,
    /// Published for the status endpoint.
    pub status: Arc<Mutex<WorkerStatus>>,
    /// The process-wide ZeroMQ context.
    pub zmq: zmq::Context,
}

/// Sockets and state of a running worker.
struct Worker {
    ctx: WorkerCtx,
    sub: zmq::Socket,
    monitor: zmq::Socket,
    dealer: Option<zmq::Socket>,
    /// Replay requests sent: replies read before a new request are not fed to it.
    requests: u64,
    recovery: Recovery,
    status: WorkerStatus,
    actions: Vec<Action>,
    /// Whether this poll changed the writer's state (to publish at its end).
    dirty: bool,
    /// Whether the next invalidation is logged at WARN: once per loss of synchronization, so a
    /// publisher that keeps failing does not fill the log.
    warn_on_invalidate: bool,
}

/// Runs the worker until stopped; an error means sockets could not be set up.
pub fn run(ctx: WorkerCtx, id: u64) -> Result<(), zmq::Error> {
    let mut w = Worker::open(ctx, id)?;
    // inproc (the bind receiver's socket) has no ZMTP handshake, and libzmq reports no monitor
    // event for it: connected at once.
    if w.ctx.spec.endpoint.starts_with("inproc://") {
        w.status.connected = true;
        w.recovery.on_connected(Instant::now(), &mut w.actions);
        w.run_actions(Instant::now())?;
    }
    while !w.ctx.stop.is_set() {
        if let Err(e) = w.poll_once() {
            // Counters of this poll (a gap found just before the failure) are not lost.
            w.publish_status();
            return Err(e);
        }
    }
    Ok(())
}

fn max_frame(limits: &Limits) -> i64 {
    // A hard ceiling above the configured limit: payloads between the two get a readable
    // "exceeds max_message_bytes" error from the decoder; beyond it libzmq drops the peer.
    (limits.max_message_bytes as i64).saturating_mul(2).saturating_add(64 << 10)
}

/// ZMTP heartbeats: a PING every third of `timeout` (at least 100 ms); no traffic from the
/// publisher for `timeout` closes the connection, which the socket monitor reports as a
/// disconnect. libzmq publishers answer PINGs without any option set. Zero turns them off.
fn set_heartbeats(sub: &zmq::Socket, timeout: std::time::Duration) -> Result<(), zmq::Error> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    if timeout_ms == 0 {
        return Ok(());
    }
    sub.set_heartbeat_ivl((timeout_ms / 3).max(100))?;
    sub.set_heartbeat_timeout(timeout_ms)?;
    // Asks the publisher to drop this connection too if kvdir goes silent that long.
    sub.set_heartbeat_ttl(timeout_ms.clamp(100, 6_553_599))
}

impl Worker {
    fn open(ctx: WorkerCtx, id: u64) -> Result<Worker, zmq::Error> {
        faults::check(FaultPoint::WorkerOpen, &ctx.spec.instance_name, ctx.spec.dp_rank)?;
        let sub = ctx.zmq.socket(zmq::SUB)?;
        sub.set_linger(0)?;
        sub.set_rcvhwm(SUB_HWM)?;
        sub.set_maxmsgsize(max_frame(&ctx.limits))?;
        sub.set_reconnect_ivl(100)?;
        sub.set_reconnect_ivl_max(2000)?;
        set_heartbeats(&sub, ctx.limits.publisher_timeout)?;
        let mon_addr = format!("inproc://kvdir-monitor-{id}");
        // HANDSHAKE_SUCCEEDED, not CONNECTED: a TCP connect only reaches the nearest hop (a
        // proxy or a listen backlog). After the ZMTP handshake the subscription is on its way
        // to the publisher itself, so a snapshot taken from then on is not followed by events
        // the publisher drops for want of a subscriber.
        let events =
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32 | zmq::SocketEvent::DISCONNECTED as i32;
        sub.monitor(&mon_addr, events)?;
        let monitor = ctx.zmq.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(&mon_addr)?;
        sub.set_subscribe(ctx.spec.topic.as_bytes())?;
        sub.connect(&ctx.spec.endpoint)?;
        // A restarted worker continues its predecessor's counters.
        let status = lock(&ctx.status).clone();
        let index_config = ctx.spec.index_config(&ctx.limits);
        let recovery =
            Recovery::new(RecoveryConfig::for_stream(&ctx.spec, &ctx.limits), index_config)
                .continuing(status.stats);
        let status = WorkerStatus { connected: false, ..status };
        let actions = Vec::new();
        let warn_on_invalidate = true;
        Ok(Worker {
            ctx,
            sub,
            monitor,
            dealer: None,
            requests: 0,
            recovery,
            status,
            actions,
            dirty: false,
            warn_on_invalidate,
        })
    }

    fn poll_once(&mut self) -> Result<(), zmq::Error> {
        let (sub_ready, mon_ready, dealer_ready) = {
            let mut items = vec![
                self.sub.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
                zmq::PollItem::from_fd(self.ctx.stop_listener.fd(), zmq::POLLIN),
            ];
            if let Some(d) = &self.dealer {
                items.push(d.as_poll_item(zmq::POLLIN));
            }
            zmq::poll(&mut items, self.poll_timeout_ms())?;
            if items[2].is_readable() {
                self.ctx.stop_listener.drain();
            }
            (
                items[0].is_readable(),
                items[1].is_readable(),
                items.get(3).is_some_and(|i| i.is_readable()),
            )
        };
        let now = Instant::now();
        if mon_ready {
            self.read_monitor(now)?;
        }
        if sub_ready {
            self.read_live(now)?;
        }
        if dealer_ready {
            self.read_snapshot(now)?;
        }
        self.recovery.on_tick(now, &mut self.actions);
        self.run_actions(now)?;
        self.publish();
        self.publish_status();
        Ok(())
    }

    fn read_monitor(&mut self, now: Instant) -> Result<(), zmq::Error> {
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let Some(ev) = frames.first().filter(|f| f.len() >= 2) else { continue };
            let event = u16::from_ne_bytes([ev[0], ev[1]]);
            if event == zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16 {
                tracing::info!(endpoint = %self.ctx.spec.endpoint, "connected to publisher");
                self.status.connected = true;
                self.recovery.on_connected(now, &mut self.actions);
            } else if event == zmq::SocketEvent::DISCONNECTED as u16 {
                tracing::warn!(endpoint = %self.ctx.spec.endpoint, "publisher disconnected");
                self.status.connected = false;
                self.recovery.on_disconnected(&mut self.actions);
            }
        }
        Ok(())
    }

    fn read_live(&mut self, now: Instant) -> Result<(), zmq::Error> {
        for _ in 0..MAX_BURST {
            let frames = match self.sub.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => break,
                Err(e) => return Err(e),
            };
            self.status.messages += 1;
            let wire_bytes: usize = frames.iter().map(Vec::len).sum();
            let mut batch = Batch::default();
            let topic = self.ctx.spec.topic.as_bytes();
            match decode_live(&frames, topic, self.ctx.limits.max_message_bytes, &mut batch) {
                Ok(seq) if batch.dp_rank != self.ctx.spec.dp_rank => {
                    let fault = StreamFault::WrongDpRank {
                        got: batch.dp_rank,
                        want: self.ctx.spec.dp_rank,
                    };
                    self.fault(fault, seq, now);
                }
                Ok(seq) => {
                    self.status.skipped_events += batch.skipped.total();
                    self.recovery.on_live(seq, batch, wire_bytes, now, &mut self.actions);
                }
                Err(e) => {
                    self.status.decode_errors += 1;
                    self.fault(StreamFault::LiveRejected(e.to_string()), 0, now);
                }
            }
            self.run_actions(now)?;
        }
        Ok(())
    }

    /// A fault found by the worker; WARN when it ends synchronization, DEBUG while recovering
    /// (a publisher sending garbage must not flood the log).
    fn fault(&mut self, fault: StreamFault, seq: u64, now: Instant) {
        let (stream, dp) = (&self.ctx.spec.instance_name, self.ctx.spec.dp_rank);
        let reason = fault.label();
        if self.recovery.phase() == StreamPhase::Live {
            tracing::warn!(%stream, dp, seq, reason, fault = %fault, "stream fault");
        } else {
            tracing::debug!(%stream, dp, seq, reason, fault = %fault, "stream fault while recovering");
        }
        self.status.last_fault = Some(fault.to_string());
        self.recovery.on_fault(fault, now, &mut self.actions);
    }

    fn read_snapshot(&mut self, now: Instant) -> Result<(), zmq::Error> {
        let Some(dealer) = &self.dealer else { return Ok(()) };
        let mut frames = Vec::new();
        while let Ok(f) = dealer.recv_multipart(zmq::DONTWAIT) {
            frames.push(f);
            if frames.len() >= MAX_BURST {
                break;
            }
        }
        let request = self.requests;
        for f in frames {
            if self.requests != request || !self.recovery.awaits_reply() {
                break; // the attempt ended; what it had queued is stale
            }
            self.status.snapshot_bytes += f.iter().map(|f| f.len() as u64).sum::<u64>();
            match self.ctx.spec.replay {
                ReplayKind::Snapshot => self.snapshot_reply(&f, now),
                ReplayKind::History => self.history_reply(&f, now),
            }
            self.run_actions(now)?;
        }
        Ok(())
    }

    fn snapshot_reply(&mut self, frames: &[Vec<u8>], now: Instant) {
        let mut batch = Batch::default();
        match decode_snapshot_frame(frames, self.ctx.limits.max_message_bytes, &mut batch) {
            Ok(SnapshotFrame::Reply { watermark }) => {
                self.recovery.on_snapshot_reply(watermark, &batch, now, &mut self.actions)
            }
            Ok(SnapshotFrame::End) => self.recovery.on_snapshot_end(now, &mut self.actions),
            Err(e) => self.reply_rejected(format!("reply: {e}"), now),
        }
    }

    /// One message of a history replay: a buffered batch, applied as it comes, or the end.
    fn history_reply(&mut self, frames: &[Vec<u8>], now: Instant) {
        let mut batch = Batch::default();
        let (topic, max) = (self.ctx.spec.replay_topic(), self.ctx.limits.max_message_bytes);
        match decode_history_frame(frames, topic, max, &mut batch) {
            Ok(HistoryFrame::Batch { seq }) => {
                self.status.skipped_events += batch.skipped.total();
                self.recovery.on_history_batch(seq, batch, now, &mut self.actions)
            }
            Ok(HistoryFrame::End) => self.recovery.on_snapshot_end(now, &mut self.actions),
            Err(e) => self.reply_rejected(format!("history reply: {e}"), now),
        }
    }

    fn reply_rejected(&mut self, text: String, now: Instant) {
        let fault = StreamFault::SnapshotRejected(text);
        self.status.last_fault = Some(fault.to_string());
        self.recovery.on_snapshot_error(fault, now, &mut self.actions);
    }

    fn run_actions(&mut self, now: Instant) -> Result<(), zmq::Error> {
        while !self.actions.is_empty() {
            for a in std::mem::take(&mut self.actions) {
                self.run_action(a, now)?;
            }
        }
        Ok(())
    }

    fn run_action(&mut self, action: Action, now: Instant) -> Result<(), zmq::Error> {
        match action {
            Action::Apply { seq, batch } => self.apply(seq, &batch, now),
            Action::Install { snapshot, watermark, deltas } => {
                self.install(*snapshot, watermark, &deltas, now);
            }
            Action::Invalidate { fault } => self.invalidate(fault),
            Action::RequestSnapshot { start_seq } => self.request_snapshot(start_seq)?,
            Action::CloseSnapshot => self.dealer = None,
            Action::Reset { partial } => self.reset(partial),
            Action::Recover { seq, batch } => self.recover(seq, &batch, now),
            Action::Resume => self.resume(),
        }
        Ok(())
    }

    /// A fresh DEALER per request: an old one may still hold stale replies.
    fn request_snapshot(&mut self, start_seq: u64) -> Result<(), zmq::Error> {
        let spec = &self.ctx.spec;
        faults::check(FaultPoint::SnapshotRequest, &spec.instance_name, spec.dp_rank)?;
        let dealer = self.ctx.zmq.socket(zmq::DEALER)?;
        dealer.set_linger(0)?;
        dealer.set_maxmsgsize(max_frame(&self.ctx.limits))?;
        dealer.connect(&self.ctx.spec.replay_endpoint)?;
        dealer.send_multipart([&b""[..], &start_seq.to_be_bytes()[..]], zmq::DONTWAIT).or_else(
            |e| {
                // No peer yet: the request is lost and the replay timeout retries it.
                if e == zmq::Error::EAGAIN {
                    Ok(())
                } else {
                    Err(e)
                }
            },
        )?;
        self.dealer = Some(dealer);
        self.requests += 1;
        Ok(())
    }

    /// Until the recovery machine's next deadline (snapshot timeout, back-off, resync), at
    /// least 1 ms; with none due, no timeout (-1): a stop wakes the thread through its
    /// listener.
    fn poll_timeout_ms(&self) -> i64 {
        match self.recovery.next_deadline() {
            Some(at) => at.saturating_duration_since(Instant::now()).as_millis().max(1) as i64,
            None => -1,
        }
    }

    fn publish_status(&mut self) {
        self.status.phase = self.recovery.phase();
        if self.status.phase == StreamPhase::Live {
            self.warn_on_invalidate = true;
        }
        let stats = self.recovery.stats();
        if stats.recoveries > self.status.stats.recoveries {
            if let Some(took) = stats.last_recovery {
                self.ctx.shared.counters.recovery.observe(took);
            }
        }
        self.status.stats = stats;
        let mut s = lock(&self.ctx.status);
        if *s != self.status {
            s.clone_from(&self.status);
        }
    }
}
