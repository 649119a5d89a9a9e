//! The snapshot endpoint on real sockets: full-state payloads, watermarks, and every
//! [`SnapshotMode`]. A kvdir index loaded from the snapshot (and fed the live batches after its
//! watermark) must agree with the simulator's ground truth.

use crate::common;

use std::time::Duration;

use common::{blocks, index_for, index_match, request_snapshot, start, Subscriber, DEADLINE};
use kvdir::wire::{decode_snapshot_frame, Batch, WireError};
use kvdir_sim::workload::{Workload, WorkloadConfig};
use kvdir_sim::{EngineConfig, Fault, SimEngine, SnapshotMode};

const B: u32 = 4;
/// How long a negative check waits for a message that must not come.
const SILENCE: Duration = Duration::from_millis(300);

fn engine() -> SimEngine {
    start(EngineConfig {
        block_size: B,
        device_capacity_blocks: 24,
        host_capacity_blocks: 16,
        ..EngineConfig::default()
    })
}

fn workload() -> Workload {
    Workload::new(WorkloadConfig {
        system_prompts: 3,
        system_prompt_tokens: 16,
        sessions: 8,
        turn_tokens: 1..=10,
        max_turns: 4,
        vocab_size: 50,
        ..WorkloadConfig::default()
    })
}

/// Drives `n` workload requests on rank 0 (every fifth one also offloaded); returns the prompts.
fn drive(engine: &SimEngine, w: &mut Workload, n: usize) -> Vec<Vec<i32>> {
    (0..n)
        .map(|i| {
            let r = w.next_request();
            engine.process(0, &r.tokens).unwrap();
            if i % 5 == 0 {
                engine.offload(0, &r.tokens).unwrap();
            }
            r.tokens
        })
        .collect()
}

fn assert_index_agrees(engine: &SimEngine, index: &common::OneStream, prompts: &[Vec<i32>]) {
    let status = index.status();
    assert!(status.synchronized, "{:?}", status.error);
    assert_eq!((status.device_blocks, status.host_blocks), engine.counts(0).unwrap());
    for tokens in prompts {
        assert_eq!(index_match(index, tokens), engine.resident(0, tokens).unwrap());
    }
}

#[test]
fn snapshot_is_a_parent_first_full_state_matching_the_ground_truth() {
    let engine = engine();
    let prompts = drive(&engine, &mut workload(), 60);
    let (device, host) = engine.counts(0).unwrap();
    assert!(device > 0 && host > 0, "the workload used both tiers");
    let (watermark, batch) = request_snapshot(&engine, 0, 0, DEADLINE).decode();
    assert_eq!(watermark, engine.next_sequence(0).unwrap());
    common::assert_parent_first(&batch);
    let mut index = index_for(&engine);
    let stats = index.load_snapshot(&batch, watermark).unwrap();
    assert_eq!(stats.orphans, 0);
    index.publish();
    assert_index_agrees(&engine, &index, &prompts);
}

#[test]
fn snapshot_then_live_batches_after_the_watermark_stay_in_sync() {
    let engine = engine();
    let sub = Subscriber::connect(&engine, 0);
    let mut w = workload();
    let mut prompts = drive(&engine, &mut w, 30);
    let (watermark, batch) = request_snapshot(&engine, 0, 0, DEADLINE).decode();
    prompts.extend(drive(&engine, &mut w, 30));
    let mut index = index_for(&engine);
    index.load_snapshot(&batch, watermark).unwrap();
    let last = engine.next_sequence(0).unwrap();
    let mut expected = 0;
    while expected < last {
        let (seq, batch) = sub.recv_live();
        assert_eq!(seq, expected, "no gap");
        if seq >= watermark {
            index.apply(seq, &batch).unwrap();
        }
        expected += 1;
    }
    index.publish();
    assert_index_agrees(&engine, &index, &prompts);
}

#[test]
fn the_watermark_counts_withheld_batches() {
    let engine = engine();
    engine.faults(0, Fault::LoseTail(true)).unwrap();
    engine.process(0, &blocks(0, 2, B)).unwrap();
    engine.process(0, &blocks(100, 2, B)).unwrap();
    let (watermark, batch) = request_snapshot(&engine, 0, 0, DEADLINE).decode();
    assert_eq!(watermark, 2);
    assert_eq!(batch.block_count(), 4, "the snapshot reveals the lost tail");
}

#[test]
fn stall_never_answers() {
    let engine = engine();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Stall)).unwrap();
    let reply = request_snapshot(&engine, 0, 0, SILENCE);
    assert!(reply.replies.is_empty() && !reply.ended, "{reply:?}");
}

#[test]
fn truncate_sends_the_reply_but_no_terminator() {
    let engine = engine();
    engine.process(0, &blocks(0, 2, B)).unwrap();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Truncate)).unwrap();
    let reply = request_snapshot(&engine, 0, 0, SILENCE);
    assert_eq!((reply.replies.len(), reply.ended), (1, false));
    let mut batch = Batch::default();
    assert!(decode_snapshot_frame(&reply.replies[0], common::MAX_BYTES, &mut batch).is_ok());
    assert_eq!(batch.block_count(), 2);
}

#[test]
fn refuse_sends_only_the_terminator() {
    let engine = engine();
    engine.process(0, &blocks(0, 2, B)).unwrap();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Refuse)).unwrap();
    let reply = request_snapshot(&engine, 0, 0, DEADLINE);
    assert!(reply.ended && reply.replies.is_empty(), "{reply:?}");
}

#[test]
fn malformed_sends_a_payload_that_does_not_decode_then_the_terminator() {
    let engine = engine();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Malformed)).unwrap();
    let reply = request_snapshot(&engine, 0, 0, DEADLINE);
    assert!(reply.ended);
    assert_eq!(reply.replies.len(), 1);
    let mut batch = Batch::default();
    let err = decode_snapshot_frame(&reply.replies[0], common::MAX_BYTES, &mut batch).unwrap_err();
    assert!(matches!(err, WireError::Type { .. }), "{err}");
}

#[test]
fn normal_mode_is_restored_and_an_empty_cache_is_an_empty_full_state() {
    let engine = engine();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Stall)).unwrap();
    engine.faults(0, Fault::Snapshot(SnapshotMode::Normal)).unwrap();
    let (watermark, batch) = request_snapshot(&engine, 0, 7, DEADLINE).decode();
    assert_eq!((watermark, batch.events.len()), (0, 0));
}
