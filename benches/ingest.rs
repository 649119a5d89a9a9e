//! Criterion bench (ingest): written with the benchmarks step.

fn main() {}
