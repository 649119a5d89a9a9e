//! The Mooncake trace through thousands of simulated workers into kvdir's shared indexes, in
//! one process: KV events applied and queries answered a second, query p50/p99, and the share
//! of events still queued at the scheduled end, per worker count (see `mooncake/mod.rs`).
//!
//! `cargo bench -p kvdir-service --bench mooncake_scale -- --workers 256,1024,4096`
//! (`-- --help` lists the flags; docs/load-tool.md).

mod mooncake;

use kvdir_bench::replay::trace::Trace;
use mooncake::{Options, USAGE};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let o = match Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let trace = match Trace::read(&o.trace, o.requests) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if !o.json {
        println!(
            "{}: {} requests x {} copies, {}-block caches, block size {}, speed {}, {} apply \
             threads, {} query clients",
            o.trace.display(),
            trace.requests.len(),
            o.shape.copies,
            o.shape.cache_blocks,
            o.pace.block_size,
            o.pace.speed,
            o.pace.apply_threads,
            o.pace.query_threads
        );
    }
    for &workers in &o.workers {
        let (report, _, _) = mooncake::run(&o, &trace, workers);
        if o.json {
            println!("{}", report.to_json());
        } else {
            println!("{}", report.text());
        }
    }
}
