//! The Mooncake scale bench (`benches/mooncake_scale.rs`), run tiny: 8 workers, the first 200
//! requests of the conversation trace, caches of 16 trace blocks so that removals happen. The
//! report must add up (every event produced is applied, the queued share is what was not
//! applied at the scheduled end, one query per request, one lag per batch), the index must
//! hold exactly what the simulated caches hold, and kvdir's answer for a prompt must equal a
//! brute-force prefix walk of every worker's cache.

#[path = "../../benches/mooncake/mod.rs"]
mod mooncake;

use kvdir_bench::replay::trace::{Trace, TRACE_BLOCK};
use mooncake::Options;

fn options(flags: &[&str]) -> Options {
    Options::parse(flags.iter().map(|f| f.to_string())).expect("valid flags")
}

#[test]
fn a_tiny_replay_adds_up_and_answers_as_a_brute_force_walk() {
    let o = options(&["--workers", "8", "--cache_blocks", "16", "--speed", "2000"]);
    let trace = Trace::read(&o.trace, Some(200)).expect("the trace is in the repository");
    let (report, workload, fleet) = mooncake::run(&o, &trace, 8);
    let (c, m) = (report.counts, &report.measured);

    // Counted independently of the simulation's own totals.
    let events: u64 = workload.items.iter().map(|i| i.events() as u64).sum();
    assert_eq!((c.events(), c.batches), (events, workload.items.len() as u64));
    assert!(c.removes > 0 && c.stores > 0, "16-block caches evict: {c:?}");
    assert_eq!(m.applied, c.events(), "every event produced is applied");
    assert!(m.applied_at_end <= m.applied);
    assert_eq!(report.queued_at_end() + m.applied_at_end, c.events());
    assert_eq!(m.index_errors, 0);
    assert_eq!(m.lag_us.len() as u64, c.batches, "one lag per batch");
    assert_eq!((report.queries, m.query_ns.len()), (200, 200), "one query per request");
    assert_eq!(m.query_cpu_ns.len(), 200, "one CPU time per query");
    assert!(m.apply_cpu > std::time::Duration::ZERO, "applying costs the apply threads CPU");
    assert!(m.events_done <= m.elapsed && m.queries_done <= m.elapsed);
    assert!(m.answer_bytes > 0);

    // The index holds what the caches hold: 4 kvdir blocks of 128 per trace block.
    let split = (TRACE_BLOCK / 128) as u64;
    for (w, writer) in fleet.writers.iter().enumerate() {
        let held = workload.caches[w].len() as u64 * split;
        assert_eq!(writer.status().device_blocks, held, "worker {w}");
    }
    let stored = c.stored_blocks - c.removed_blocks;
    assert_eq!(stored, workload.caches.iter().map(|c| c.len() as u64).sum::<u64>());

    // kvdir's answers against a walk of each cache, for every 10th request (0 hits included).
    let mut hits = 0;
    for r in trace.requests.iter().step_by(10) {
        let read = fleet.directory.read(&r.tokens());
        assert_eq!(read.len(), 8, "one entry per worker");
        for hit in &read {
            let w: usize = hit.instance_name()["worker-".len()..].parse().expect("a worker");
            let blocks = workload.caches[w].prefix_hits(r.full_blocks());
            assert_eq!(
                hit.hit,
                ((blocks * TRACE_BLOCK) as u64, 0),
                "request {}, worker {w}",
                r.index
            );
            hits += blocks;
        }
    }
    assert!(hits > 0, "some prompts are still cached at the end");
}

#[test]
fn bad_flags_name_the_value_and_the_fix() {
    let bad = |flags: &[&str]| Options::parse(flags.iter().map(|f| f.to_string())).unwrap_err();
    assert!(bad(&["--block_size", "100"]).contains("must divide 512"));
    assert!(bad(&["--workers", "8,0"]).contains("each in 1..=65536"));
    assert!(bad(&["--speed"]).contains("needs a value"));
    assert!(bad(&["--nope", "1"]).contains("unknown flag --nope"));
}
