//! Criterion bench (query): written with the benchmarks step.

fn main() {}
