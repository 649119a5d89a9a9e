//! The `IndexActor` owns its stream's writer: an invalidation it receives (a failed worker)
//! ends the stream's credit at once, and `Shutdown` removes the stream's bits and entry before
//! it is acknowledged, after which the stream thread finds no writer.

use std::sync::Arc;

use actix::Actor;
use kvdir::index::{IndexConfig, SharedIndex, SharedSnapshot};
use kvdir::stream::StreamFault;
use kvdir::wire::{Batch, EngineHash, Tier};
use kvdir_service::stream::Shutdown;
use kvdir_service::stream::{IndexActor, Invalidate, StreamShared};

fn stored(h: u128, tokens: [i32; 2]) -> Batch {
    let mut b = Batch::default();
    b.push_stored(&[EngineHash(h)], None, &tokens, 2, Tier::Device);
    b
}

#[actix_rt::test]
async fn invalidate_ends_credit_and_shutdown_removes_the_stream() {
    let config = IndexConfig { block_size: 2, hash_seed: 1024, salt: 0, max_blocks: 100 };
    let index = SharedIndex::new(config.block_size, config.hash_seed, 1);
    let shared = Arc::new(StreamShared::new("a", 0, index.add_stream(config).unwrap()));
    let slot = shared.with_writer(|w| {
        let mut snap = SharedSnapshot::new(config);
        snap.add(&stored(1, [1, 2])).unwrap();
        w.install_snapshot(snap, 5);
        w.publish();
        w.slot()
    });
    let slot = slot.expect("a writer");
    let mut reader = index.reader().handle();
    assert_eq!(reader.query(&[1, 2]).tokens(slot), (2, 0), "the stream holds the block");

    let addr = IndexActor::new(Arc::clone(&shared)).start();
    addr.send(Invalidate { fault: StreamFault::WorkerFailed("test".into()) }).await.unwrap();
    assert_eq!(reader.query(&[1, 2]).tokens(slot), (0, 0), "no credit once invalidated");
    let error = reader.status(slot).and_then(|s| s.error.clone());
    assert_eq!(error.as_deref(), Some("stream worker failed: test"));

    addr.send(Shutdown).await.unwrap();
    assert!(reader.status(slot).is_none(), "the stream left the index before the answer");
    assert!(shared.with_writer(|_| ()).is_none(), "the stream thread finds no writer");
}
