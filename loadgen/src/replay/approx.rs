//! `kvdir-bench replay --events none`: the engines' KV events are not followed, and kvdir
//! credits them approximately from its own routing (docs/operations.md, *Engines without KV
//! events*). The engines still register in etcd and publish events nobody subscribes to; the
//! spawned kvdir's discovery says `"events": "none"` and credits each engine at most its Device
//! blocks (`--cache_blocks`), as an operator would configure it. There are no streams to wait
//! for: a run starts once every instance has a load report, and has nothing to catch up.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::super::report::Applied;
use super::ReplayOptions;

/// Turns the kvdir config of an exact run into the approximate one.
pub fn configure(config: &mut Value, o: &ReplayOptions) {
    if let Some(d) = config.get_mut("discovery").and_then(Value::as_object_mut) {
        d.insert("events".into(), json!("none"));
    }
    config["approximate_blocks_per_engine"] = json!(o.cache_blocks);
}

/// What a replica applied: nothing, caught up at once (it follows no stream).
pub fn nothing_applied(wall: Duration) -> Applied {
    Applied {
        batches: 0,
        messages: 0,
        wall,
        caught_up: true,
        catch_up: Duration::ZERO,
        lagging: Vec::new(),
        counters: BTreeMap::new(),
        last_fault: None,
    }
}
