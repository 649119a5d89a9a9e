//! Live messages on real sockets: framing, sequences, dialects, gaps, restarts, raw frames.

use crate::common;

use std::net::TcpListener;
use std::time::Duration;

use common::{blocks, start, Subscriber};
use kvdir::wire::record::{BatchForm, EventForm};
use kvdir::wire::{decode_live, Batch, EngineHash, Event, Tier, WireError};
use kvdir_sim::{block_hashes, EngineConfig, Fault, HashMode, Published, SimEngine, SimError};

const B: u32 = 4;

fn config() -> EngineConfig {
    EngineConfig { block_size: B, ..EngineConfig::default() }
}

fn canonical(mode: HashMode, tokens: &[i32]) -> Vec<EngineHash> {
    block_hashes(B, tokens).into_iter().map(|h| mode.to_wire(h).canonical()).collect()
}

fn only_store(batch: &Batch) -> (Vec<EngineHash>, Option<EngineHash>, usize, Tier) {
    let [Event::Stored(s)] = batch.events.as_slice() else {
        panic!("one BlockStored expected: {:?}", batch.events)
    };
    (batch.hashes(s.hashes).to_vec(), s.parent, batch.tokens(s.tokens).len(), s.tier)
}

#[test]
fn live_batches_decode_with_consecutive_sequences_from_zero_per_rank() {
    let engine = start(EngineConfig { dp_size: 2, ..config() });
    let subs = [Subscriber::connect(&engine, 0), Subscriber::connect(&engine, 1)];
    for rank in 0..2 {
        for (i, first) in [0, 100, 200].into_iter().enumerate() {
            let tokens = blocks(first, 2, B);
            assert_eq!(engine.process(rank, &tokens).unwrap(), Some(i as u64));
            let (seq, batch) = subs[rank as usize].recv_live();
            assert_eq!((seq, batch.dp_rank), (i as u64, rank));
            let hashes = canonical(HashMode::U64, &tokens);
            assert_eq!(only_store(&batch), (hashes, None, 8, Tier::Device));
        }
        assert_eq!(engine.next_sequence(rank).unwrap(), 3);
    }
}

#[test]
fn published_counts_batches_events_and_blocks_but_not_withheld_batches() {
    let engine = start(EngineConfig { device_capacity_blocks: 2, ..config() });
    assert_eq!(engine.published(0).unwrap(), Published::default());
    engine.process(0, &blocks(0, 2, B)).unwrap();
    // Two new blocks evict the first two: one store of 2 and one removal of 2.
    engine.process(0, &blocks(100, 2, B)).unwrap();
    let want = Published { batches: 2, events: 3, blocks: 6 };
    assert_eq!(engine.published(0).unwrap(), want);
    engine.faults(0, Fault::DropNext(1)).unwrap();
    engine.process(0, &blocks(200, 1, B)).unwrap();
    assert_eq!(engine.published(0).unwrap(), want, "a withheld batch is not published");
}

#[test]
fn a_longer_prompt_stores_only_its_new_blocks_under_the_right_parent() {
    let engine = start(config());
    let sub = Subscriber::connect(&engine, 0);
    let tokens = blocks(0, 3, B);
    engine.process(0, &tokens[..4 * 2 + 1]).unwrap();
    sub.recv_live();
    assert_eq!(engine.process(0, &tokens[..8]).unwrap(), None, "nothing new, nothing published");
    assert_eq!(engine.process(0, &tokens).unwrap(), Some(1));
    let (seq, batch) = sub.recv_live();
    let hashes = canonical(HashMode::U64, &tokens);
    assert_eq!(seq, 1);
    assert_eq!(only_store(&batch), (hashes[2..].to_vec(), Some(hashes[1]), 4, Tier::Device));
}

#[test]
fn vllm_dialect_map_batches_positional_events_and_bin32_hashes_decode() {
    let engine = start(EngineConfig {
        hash_mode: HashMode::Bin32,
        batch_form: BatchForm::Map,
        event_form: EventForm::Positional,
        topic: String::new(),
        ..config()
    });
    let sub = Subscriber::connect(&engine, 0);
    let tokens = blocks(7, 2, B);
    engine.process(0, &tokens).unwrap();
    let (seq, batch) = sub.recv_live();
    assert_eq!(seq, 0);
    assert_eq!(only_store(&batch), (canonical(HashMode::Bin32, &tokens), None, 8, Tier::Device));
}

#[test]
fn drop_next_makes_a_visible_sequence_gap() {
    let engine = start(config());
    let sub = Subscriber::connect(&engine, 0);
    engine.faults(0, Fault::DropNext(2)).unwrap();
    for first in [0, 100, 200] {
        engine.process(0, &blocks(first, 1, B)).unwrap();
    }
    let (seq, _) = sub.recv_live();
    assert_eq!(seq, 2, "sequences 0 and 1 were consumed but not sent");
    assert_eq!(engine.counts(0).unwrap(), (3, 0), "withheld batches still changed the cache");
}

#[test]
fn lose_tail_withholds_until_switched_off_and_quiet_changes_nothing() {
    let engine = start(config());
    let sub = Subscriber::connect(&engine, 0);
    engine.faults(0, Fault::LoseTail(true)).unwrap();
    assert_eq!(engine.process(0, &blocks(0, 1, B)).unwrap(), Some(0));
    assert_eq!(engine.process(0, &blocks(10, 1, B)).unwrap(), Some(1));
    engine.faults(0, Fault::LoseTail(false)).unwrap();
    engine.faults(0, Fault::Quiet(true)).unwrap();
    assert_eq!(engine.process(0, &blocks(20, 1, B)).unwrap(), None);
    assert_eq!(engine.clear(0).unwrap(), None);
    assert_eq!((engine.next_sequence(0).unwrap(), engine.counts(0).unwrap()), (2, (2, 0)));
    engine.faults(0, Fault::Quiet(false)).unwrap();
    engine.process(0, &blocks(30, 1, B)).unwrap();
    assert_eq!(sub.recv_live().0, 2, "the first batch after the lost tail");
}

#[test]
fn restart_resets_the_sequence_and_the_cache_on_the_same_endpoints() {
    let engine = start(config());
    let before = engine.endpoints();
    let sub = Subscriber::connect(&engine, 0);
    engine.process(0, &blocks(0, 2, B)).unwrap();
    engine.process(0, &blocks(50, 2, B)).unwrap();
    assert_eq!(sub.recv_live().0, 0);
    assert_eq!(sub.recv_live().0, 1);
    engine.restart(0).unwrap();
    assert_eq!(engine.endpoints(), before);
    assert_eq!((engine.next_sequence(0).unwrap(), engine.counts(0).unwrap()), (0, (0, 0)));
    sub.resync(&engine);
    assert_eq!(engine.process(0, &blocks(0, 2, B)).unwrap(), Some(0));
    let (seq, batch) = sub.recv_live();
    assert_eq!(seq, 0, "a regression: the publisher restarted");
    assert_eq!(only_store(&batch).0.len(), 2, "the old blocks are gone, so they are stored again");
}

#[test]
fn clear_and_full_state_batches() {
    let engine = start(config());
    let sub = Subscriber::connect(&engine, 0);
    engine.process(0, &blocks(0, 3, B)).unwrap();
    sub.recv_live();
    assert_eq!(engine.publish_full_state(0).unwrap(), 1);
    let (_, batch) = sub.recv_live();
    assert!(batch.is_full_state());
    common::assert_parent_first(&batch);
    assert_eq!(batch.block_count(), 3);
    assert_eq!(engine.clear(0).unwrap(), Some(2));
    let (_, batch) = sub.recv_live();
    assert_eq!(batch.events, vec![Event::Cleared { tier: None }]);
    assert_eq!(engine.counts(0).unwrap(), (0, 0));
}

#[test]
fn send_raw_puts_arbitrary_frames_on_the_wire() {
    let engine = start(config());
    let sub = Subscriber::connect(&engine, 0);
    let topic = b"xllm-kv".to_vec();
    let wrong_topic = vec![b"xllm-kv-other".to_vec(), 0u64.to_be_bytes().to_vec(), vec![0x90]];
    engine.send_raw(0, wrong_topic).unwrap();
    engine.send_raw(0, vec![topic.clone(), vec![1, 2, 3], vec![0x90]]).unwrap();
    let mut batch = Batch::default();
    let frames = sub.recv(common::DEADLINE).unwrap();
    assert!(matches!(
        decode_live(&frames, &topic, 1 << 20, &mut batch),
        Err(WireError::TopicMismatch { .. })
    ));
    let frames = sub.recv(common::DEADLINE).unwrap();
    assert_eq!(
        decode_live(&frames, &topic, 1 << 20, &mut batch),
        Err(WireError::SequenceLength { field: "sequence", len: 3 })
    );
    assert_eq!(engine.next_sequence(0).unwrap(), 0, "raw frames consume no sequence");
    sub.assert_nothing_within(Duration::from_millis(50));
}

#[test]
fn fixed_ports_follow_the_rank_rule() {
    // Ask the OS for free ports, then use them as fixed bases; retry if another process takes
    // one of the neighbouring ports meanwhile.
    for _ in 0..20 {
        let free = || TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port();
        let (event_port, replay_port) = (free(), free());
        if event_port.abs_diff(replay_port) < 2 || event_port > 65000 || replay_port > 65000 {
            continue;
        }
        let config = EngineConfig { event_port, replay_port, dp_size: 2, ..config() };
        match SimEngine::start(config) {
            Ok(engine) => {
                let eps = engine.endpoints();
                assert_eq!(eps[1].event, format!("tcp://127.0.0.1:{}", event_port + 1));
                assert_eq!(eps[1].replay, format!("tcp://127.0.0.1:{}", replay_port + 1));
                return;
            }
            Err(SimError::Bind { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no free port pair found");
}

#[test]
fn bad_calls_name_the_problem() {
    let engine = start(config());
    let err = engine.process(3, &[1]).unwrap_err().to_string();
    assert!(err.contains("rank 3 does not exist") && err.contains("dp_size = 1"), "{err}");
    let err = engine.offload(0, &[1, 2, 3, 4]).unwrap_err().to_string();
    assert!(err.contains("host_capacity_blocks = 0"), "{err}");
    let err = SimEngine::start(EngineConfig { dp_size: 0, ..config() }).unwrap_err();
    assert!(err.to_string().contains("dp_size = 0"), "{err}");
    engine.stop();
}

#[test]
fn the_engine_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimEngine>();
}
