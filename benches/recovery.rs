//! Criterion bench (recovery): written with the benchmarks step.

fn main() {}
