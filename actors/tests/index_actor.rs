//! The `IndexActor`'s protection against stale work: messages from an older recovery epoch are
//! dropped, and an invalidation the worker could not deliver (full mailbox) is picked up from the
//! shared state by the actor's own timer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvdir::index::{IndexConfig, SharedIndex, SharedSnapshot, StreamStatus};
use kvdir::wire::{Batch, EngineHash, Tier};
use kvdir_actors::index_actor::{
    ApplyBatch, GetIndexStatus, IndexActor, InstallSnapshot, StreamShared,
};

fn stored(h: u128, tokens: [i32; 2]) -> Batch {
    let mut b = Batch::default();
    b.push_stored(&[EngineHash(h)], None, &tokens, 2, Tier::Device);
    b
}

async fn status_until(
    addr: &actix::Addr<IndexActor>,
    what: &str,
    ok: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = addr.send(GetIndexStatus).await.unwrap();
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {s:?}");
        actix_rt::time::sleep(Duration::from_millis(5)).await; // poll interval, under the deadline
    }
}

#[actix_rt::test]
async fn stale_epochs_are_dropped_and_deferred_invalidations_are_applied() {
    use actix::Actor;
    let config = IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 };
    let shared = Arc::new(StreamShared::default());
    let (tx, _rx) = std::sync::mpsc::channel();
    let index = SharedIndex::new(config.block_size, config.hash_seed, 1);
    let writer = index.add_stream(config).unwrap();
    let addr = IndexActor::new(writer, Arc::clone(&shared), tx).start();

    let mut snap = SharedSnapshot::new(config);
    snap.add(&stored(1, [1, 2])).unwrap();
    addr.send(InstallSnapshot {
        epoch: 0,
        snapshot: Box::new(snap),
        watermark: 5,
        deltas: Vec::new(),
    })
    .await
    .unwrap();
    addr.send(ApplyBatch { epoch: 0, seq: 5, batch: stored(2, [3, 4]), queued_bytes: 0 })
        .await
        .unwrap();
    let s = status_until(&addr, "the snapshot and a delta", |s| s.synchronized).await;
    assert_eq!((s.sequence, s.device_blocks), (Some(5), 2));

    // The worker moved on (a fault) but could not deliver its invalidation.
    shared.epoch.store(1, Ordering::Release);
    *shared.pending_invalidation.lock().unwrap() =
        Some("index mailbox full (256 messages); resynchronizing".into());
    let s = status_until(&addr, "the deferred invalidation", |s| !s.synchronized).await;
    assert_eq!(s.error.as_deref(), Some("index mailbox full (256 messages); resynchronizing"));

    // A batch queued before the fault is not applied.
    addr.send(ApplyBatch { epoch: 0, seq: 6, batch: stored(3, [5, 6]), queued_bytes: 0 })
        .await
        .unwrap();
    let s = addr.send(GetIndexStatus).await.unwrap();
    assert_eq!((s.sequence, s.device_blocks), (Some(5), 2), "the stale batch was dropped");

    // The next snapshot of the current epoch synchronizes again.
    let mut snap = SharedSnapshot::new(config);
    snap.add(&stored(9, [7, 8])).unwrap();
    addr.send(InstallSnapshot {
        epoch: 1,
        snapshot: Box::new(snap),
        watermark: 10,
        deltas: Vec::new(),
    })
    .await
    .unwrap();
    let s = status_until(&addr, "resync", |s| s.synchronized).await;
    assert_eq!((s.sequence, s.device_blocks), (Some(9), 1));
}
