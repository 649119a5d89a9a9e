//! A cache prefetch hint: [`prefetch`] asks the CPU to start loading the cache line of a
//! value that will be read soon, without waiting for it.
//!
//! Why a crate of its own: the index's big tables (engine hash -> block per stream, content
//! key -> holders for all streams) are far larger than the cache, so each probe is a miss. The
//! index knows the next keys ahead of time (a batch's engine hashes, a publish's changes, a
//! query's keys) and starts their misses early. Safe Rust can only do that with a load, and a
//! load must complete before the instruction retires: the peer bench measured loads that were
//! meant to hide misses stalling the hashing they overlapped, while a prefetch instruction did
//! not (BENCHMARKS.md, *The shared index against the peers*). `std::hint::prefetch_read` is not
//! stable yet (Rust issue 146941); when it is, this crate goes away.
//!
//! This is the core's only `unsafe` block; the only other `unsafe` code of the workspace is the
//! service's ZeroMQ context (`actors/src/stream/sockets.rs`, in a crate that denies `unsafe`
//! elsewhere), and every other crate forbids it. It has no unit test: a hint has no effect a
//! test could observe; the benches measure it.

/// Hints that `value`'s cache line will be read soon. Never reads or writes memory as far as
/// the program can tell, never faults, and does nothing on CPUs other than x86-64.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    #[expect(unsafe_code, reason = "a prefetch hint; see the safety comment")]
    // SAFETY: `_mm_prefetch` is unsafe only because it is a `target_feature(enable = "sse")`
    // function, and SSE is part of the x86-64 baseline, so every x86-64 CPU has it. The
    // instruction is a hint: it does not read memory as far as the program can observe and never
    // faults, whatever the address; here the address is of a live reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
