//! One stream's state on its I/O thread (`pool/`): its live input (`live.rs`: its own ZMTP
//! connection to a publisher at an IP address, a libzmq SUB socket and a socket monitor for
//! handshakes and disconnects otherwise, or, on the bind endpoint, the messages the thread
//! read for it from its rank's port), and a fresh DEALER per replay request (kvdir's own
//! connection at an IP address), each registered with the thread's `epoll` (a libzmq socket
//! by its `ZMQ_FD`).
//!
//! [`Worker::handle`] decodes what its sockets hold (a bounded burst each), drives the pure
//! [`Recovery`] machine and carries out its actions itself: the worker is the single writer of
//! its stream's state in the shared index (the writer lives in [`StreamShared`], owned by the
//! stream's `IndexActor`). Everything a turn applied is published once at its end, so a burst
//! of live batches costs one publish, and an index error goes straight back into the recovery
//! machine. Snapshots are built and installed here too. A stream that cannot keep up leaves
//! messages in the SUB socket's queue; beyond its high-water mark libzmq drops them, which the
//! next sequence number reveals as a gap. A replay waits for one of the process's replay slots
//! ([`ReplaySlot`]) before its DEALER opens.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use mio::{Registry, Token};

use kvdir::backoff::Backoff;
use kvdir::config::{Limits, ReplayKind, StreamSpec};
use kvdir::stream::{Action, Recovery, RecoveryConfig, RecoveryStats, StreamFault, StreamPhase};
use kvdir::wire::{
    decode_history_frame, decode_live, decode_snapshot_frame, HistoryFrame, SnapshotFrame,
};
use serde::Serialize;

use super::frames::{keep_batch, take_batch, Frames};
use super::pool::{fd_backoff, ReplaySlot};
use super::sockets::{Socket, ZmqContext};
use super::StreamShared;
use crate::faults::{self, FaultPoint};
use crate::sync::lock;

mod live;
mod open;
mod writes;

pub use live::token_stream;
use live::Live;
pub(crate) use open::{keepalive, KEEPALIVE_PROBES, RECONNECT_MAX, RECONNECT_MIN};
use open::{read_replies, Dealer};

/// Messages read per socket per turn: a busy or replaying stream lets the thread's other
/// streams have their turn, and keeps its place in the ready list.
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
    /// Recovery counters: `gaps`, `initial_syncs`, `resyncs`, `recoveries` (after faults only),
    /// `snapshot_failures`, `dropped_batches`,
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
    /// A hybrid model's attention classes (its KV cache groups by kind), as `kind xN` with
    /// N groups, full attention first; empty for a dense model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<String>,
    /// A hybrid stream's hashes stored by a group without content that no store located:
    /// they give no credit.
    pub unlocated_blocks: u64,
}

/// Everything a worker needs.
#[derive(Clone)]
pub struct WorkerCtx {
    /// The stream.
    pub spec: StreamSpec,
    /// Limits.
    pub limits: Limits,
    /// The stream's writer and counters, shared with its actors.
    pub shared: Arc<StreamShared>,
    /// Published for the status endpoint.
    pub status: Arc<Mutex<WorkerStatus>>,
    /// The process-wide ZeroMQ context.
    pub zmq: ZmqContext,
}

/// Sockets and state of a running stream.
pub struct Worker {
    ctx: WorkerCtx,
    /// The live input: a SUB socket, or the bind endpoint's messages for this stream.
    live: Live,
    dealer: Option<Dealer>,
    /// The thread's `epoll`, and this stream's token in it.
    registry: Arc<Registry>,
    token: Token,
    /// This stream's share of the replay DEALERs.
    replay: ReplaySlot,
    /// A replay slot came: the sequence number to request.
    granted: Option<u64>,
    /// A replay whose DEALER found no file descriptor: its sequence and when to try again.
    dealer_retry: Option<(u64, Instant)>,
    /// The wait before that try.
    fd_backoff: Backoff,
    /// Replay requests sent: replies read before a new request are not fed to it.
    requests: u64,
    recovery: Recovery,
    status: WorkerStatus,
    actions: Vec<Action>,
    /// Whether this turn changed the writer's state (to publish at its end).
    dirty: bool,
    /// The writer is gone (the stream is being stopped): the thread drops the stream.
    ended: bool,
    /// Whether the next invalidation is logged at WARN: once per loss of synchronization, so a
    /// publisher that keeps failing does not fill the log.
    warn_on_invalidate: bool,
    /// Whether a hybrid model's advice was logged (once per worker).
    hybrid_advised: bool,
    /// Whether the socket monitor's `ZMQ_FD` fired since it was last read (or it never was).
    monitor_due: bool,
    /// The SUB socket's messages are received into these.
    frames: Frames,
}

impl Worker {
    /// Opens the stream's sockets and registers them with the thread's `registry` under the
    /// token `id`.
    pub fn open(
        ctx: WorkerCtx,
        id: u64,
        registry: Arc<Registry>,
        replay: ReplaySlot,
    ) -> Result<Worker, zmq::Error> {
        faults::check(FaultPoint::WorkerOpen, &ctx.spec.instance_name, ctx.spec.dp_rank)?;
        let token = Token(id as usize);
        let live = Live::open(&ctx, id, &registry, token)?;
        // A restarted worker continues its predecessor's counters.
        let status = lock(&ctx.status).clone();
        let index_config = ctx.spec.index_config(&ctx.limits);
        let recovery_config = RecoveryConfig {
            ordered_losses: live.orders_losses(),
            ..RecoveryConfig::for_stream(&ctx.spec, &ctx.limits)
        };
        let recovery = Recovery::new(recovery_config, index_config).continuing(status.stats);
        let status = WorkerStatus { connected: false, ..status };
        let mut w = Worker {
            ctx,
            live,
            dealer: None,
            registry,
            token,
            replay,
            granted: None,
            dealer_retry: None,
            fd_backoff: fd_backoff(),
            requests: 0,
            recovery,
            status,
            actions: Vec::new(),
            dirty: false,
            ended: false,
            warn_on_invalidate: true,
            hybrid_advised: false,
            monitor_due: true,
            frames: Frames::default(),
        };
        if w.live.bound_key().is_some() || w.ctx.spec.endpoint.starts_with("inproc://") {
            // No ZMTP handshake of its own (the engine connects to the bind endpoint, or the
            // socket is in process): connected at once (the first turn runs the snapshot
            // request this queues).
            w.status.connected = true;
            w.recovery.on_connected(Instant::now(), &mut w.actions);
        }
        Ok(w)
    }

    /// The stream's settings.
    pub fn spec(&self) -> &StreamSpec {
        &self.ctx.spec
    }

    /// Whether the writer is gone, so the stream is over.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// When the recovery machine (or a DEALER waiting for a descriptor, or the live
    /// connection) next has something to do without input.
    pub fn next_deadline(&self) -> Option<Instant> {
        let retry = self.dealer_retry.map(|(_, at)| at);
        let dealer = match &self.dealer {
            Some(Dealer::Zmtp(c)) => c.deadline(),
            _ => None,
        };
        [self.recovery.next_deadline(), retry, self.live.deadline(), dealer]
            .into_iter()
            .flatten()
            .min()
    }

    /// A replay slot came for this stream (its DEALER opens in the next turn).
    pub fn granted(&mut self) {
        self.granted = self.replay.granted();
    }

    /// One turn: reads a bounded burst from each socket, runs the recovery machine's timers
    /// and actions, publishes once. `true` while a socket still holds input (`ZMQ_EVENTS`,
    /// read after the turn's last send and receive, as `ZMQ_FD`'s edge trigger requires).
    pub fn handle(&mut self) -> Result<bool, zmq::Error> {
        let now = Instant::now();
        if let Some(seq) = self.granted.take() {
            self.open_dealer(seq)?;
        }
        if let Some((seq, _)) = self.dealer_retry.filter(|(_, at)| now >= *at) {
            self.dealer_retry = None;
            if self.recovery.awaits_reply() {
                self.request_snapshot(seq)?;
            }
        }
        self.read_monitor(now)?;
        self.read_zmtp(now)?;
        self.read_live(now)?;
        self.read_snapshot(now)?;
        self.recovery.on_tick(now, &mut self.actions);
        self.run_actions(now)?;
        self.publish();
        self.publish_status();
        let dealer = match &self.dealer {
            Some(Dealer::Zmq(d)) => d.get_events()?.contains(zmq::POLLIN),
            Some(Dealer::Zmtp(c)) => c.readable(),
            None => false,
        };
        Ok(dealer || self.live.readable()?)
    }

    /// A bound stream's key in the bind endpoint's route table.
    pub fn bound_key(&self) -> Option<u64> {
        self.live.bound_key()
    }

    /// A message its thread read from the bind endpoint for this stream, taken in place:
    /// decoded and applied now, visible to queries once its turn publishes. A stream that
    /// cannot take it now (held by fault injection, or with older messages queued) queues a
    /// copy for its turn.
    pub fn deliver(&mut self, frames: &[&[u8]]) -> Result<(), zmq::Error> {
        let spec = &self.ctx.spec;
        if self.live.has_queued() || faults::stream_held(&spec.instance_name, spec.dp_rank) {
            self.live.queue(frames);
            return Ok(());
        }
        self.live_message(frames, Instant::now())
    }

    /// The socket monitor's `ZMQ_FD` fired: read it in the stream's next turn.
    pub fn monitor_fired(&mut self) {
        self.monitor_due = true;
    }

    /// Reads the monitor to empty, if it fired since it was last read.
    fn read_monitor(&mut self, now: Instant) -> Result<(), zmq::Error> {
        if !std::mem::take(&mut self.monitor_due) {
            return Ok(());
        }
        let Some(monitor) = self.live.monitor() else { return Ok(()) };
        while let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) {
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

    /// Reads a bounded burst of live messages: a bound stream's queued ones, or its SUB
    /// socket's, each received into the worker's reused frames.
    fn read_live(&mut self, now: Instant) -> Result<(), zmq::Error> {
        let mut frames = std::mem::take(&mut self.frames);
        let read = self.read_live_burst(&mut frames, now);
        frames.release();
        self.frames = frames;
        read
    }

    fn read_live_burst(&mut self, frames: &mut Frames, now: Instant) -> Result<(), zmq::Error> {
        for _ in 0..MAX_BURST {
            if let Some(queued) = self.live.queued() {
                let parts: Vec<&[u8]> = queued.iter().map(Vec::as_slice).collect();
                self.live_message(&parts, now)?;
            } else if self.live.recv(frames)? {
                frames.with(|parts| self.live_message(parts, now))?;
            } else {
                break;
            }
        }
        Ok(())
    }

    /// One live message: decoded into the thread's spare batch, fed to the recovery machine,
    /// its actions carried out.
    fn live_message(&mut self, frames: &[&[u8]], now: Instant) -> Result<(), zmq::Error> {
        self.status.messages += 1;
        let wire_bytes: usize = frames.iter().map(|f| f.len()).sum();
        let mut batch = take_batch();
        let topic = self.live.topic(&self.ctx);
        match decode_live(frames, topic, self.ctx.limits.max_message_bytes, &mut batch) {
            Ok(seq) if batch.dp_rank != self.ctx.spec.dp_rank => {
                let fault =
                    StreamFault::WrongDpRank { got: batch.dp_rank, want: self.ctx.spec.dp_rank };
                keep_batch(batch);
                self.fault(fault, seq, now);
            }
            Ok(seq) => {
                self.status.skipped_events += batch.skipped.total();
                self.recovery.on_live(seq, batch, wire_bytes, now, &mut self.actions);
            }
            Err(e) => {
                keep_batch(batch);
                self.status.decode_errors += 1;
                self.fault(StreamFault::LiveRejected(e.to_string()), 0, now);
            }
        }
        self.run_actions(now)
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
        let frames = match &mut self.dealer {
            None => return Ok(()),
            Some(Dealer::Zmq(dealer)) => {
                let mut frames = Vec::new();
                while let Ok(f) = dealer.recv_multipart(zmq::DONTWAIT) {
                    frames.push(f);
                    if frames.len() >= MAX_BURST {
                        break;
                    }
                }
                frames
            }
            Some(Dealer::Zmtp(conn)) => read_replies(conn, now, &self.registry, self.token),
        };
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
        let mut batch = take_batch();
        match decode_snapshot_frame(frames, self.ctx.limits.max_message_bytes, &mut batch) {
            Ok(SnapshotFrame::Reply { watermark }) => {
                self.recovery.on_snapshot_reply(watermark, &batch, now, &mut self.actions)
            }
            Ok(SnapshotFrame::End) => self.recovery.on_snapshot_end(now, &mut self.actions),
            Err(e) => self.reply_rejected(format!("reply: {e}"), now),
        }
        keep_batch(batch);
    }

    /// One message of a history replay: a buffered batch, applied as it comes, or the end.
    fn history_reply(&mut self, frames: &[Vec<u8>], now: Instant) {
        let mut batch = take_batch();
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
            Action::Apply { seq, batch } => {
                self.apply(seq, &batch, now);
                keep_batch(batch);
            }
            Action::Install { snapshot, watermark, deltas } => {
                self.install(*snapshot, watermark, &deltas, now);
            }
            Action::Invalidate { fault } => self.invalidate(fault),
            Action::RequestSnapshot { start_seq } => self.request_snapshot(start_seq)?,
            Action::CloseSnapshot => {
                self.close_dealer();
                self.dealer_retry = None;
                self.replay.done();
            }
            Action::Reset { partial } => self.reset(partial),
            Action::Recover { seq, batch } => {
                self.recover(seq, &batch, now);
                keep_batch(batch);
            }
            Action::Resume => self.resume(),
        }
        Ok(())
    }

    /// Publishes the status for the streams report.
    pub fn publish_status(&mut self) {
        self.status.phase = self.recovery.phase();
        if self.status.phase == StreamPhase::Live {
            self.warn_on_invalidate = true;
        }
        let stats = self.recovery.stats();
        if stats.syncs() > self.status.stats.syncs() {
            if let Some(took) = stats.last_sync {
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
