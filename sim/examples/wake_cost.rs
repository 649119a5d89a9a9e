//! What one thread wake-up costs on this machine, in CPU time (Linux only: it reads
//! `/proc/thread-self/schedstat`).
//!
//! kvdir pays two wake-ups per live message when messages come one at a time (libzmq's I/O
//! thread, then the stream's thread; BENCHMARKS.md, "End to end"), so this is the floor of its
//! CPU per batch at low load. A ticker thread sleeps `--gap_us` between messages and sends each
//! one over a channel to a receiver blocked on it; both threads' CPU time is read from the
//! kernel. A second pass, with the ticker sleeping alone, gives the cost of the sleep itself,
//! so the difference is the wake-up of the receiver: the send that wakes it plus its own
//! switch in and out.
//!
//! `cargo run --release -p kvdir-sim --example wake_cost -- [--messages N] [--gap_us U]`

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// This thread's CPU time so far (the first field of its schedstat, in nanoseconds).
fn thread_cpu_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux) is readable");
    text.split_whitespace().next().and_then(|v| v.parse().ok()).expect("a number of nanoseconds")
}

/// CPU nanoseconds of the ticker and of the receiver (if any) for `n` messages `gap` apart.
fn run(n: u64, gap: Duration, with_receiver: bool) -> (u64, u64) {
    let (tx, rx) = mpsc::channel::<u64>();
    let receiver = with_receiver.then(|| {
        std::thread::spawn(move || {
            let start = thread_cpu_ns();
            let mut sum = 0u64;
            while let Ok(v) = rx.recv() {
                sum = sum.wrapping_add(v);
            }
            std::hint::black_box(sum);
            thread_cpu_ns() - start
        })
    });
    let start = thread_cpu_ns();
    for i in 0..n {
        std::thread::sleep(gap);
        if with_receiver {
            tx.send(i).expect("the receiver runs until the channel closes");
        }
    }
    let ticker = thread_cpu_ns() - start;
    drop(tx);
    let received = receiver.map_or(0, |r| r.join().expect("the receiver does not panic"));
    (ticker, received)
}

fn flag(args: &[String], name: &str, default: u64) -> u64 {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("{name} takes a whole number, e.g. {name} {default}");
            std::process::exit(2)
        }),
        None => default,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = flag(&args, "--messages", 5_000).max(1);
    let gap = Duration::from_micros(flag(&args, "--gap_us", 1_000));
    let started = Instant::now();
    let (alone, _) = run(n, gap, false);
    let (ticker, receiver) = run(n, gap, true);
    let per = |ns: u64| ns as f64 / n as f64 / 1_000.0;
    println!(
        "{n} messages, {} µs apart, in {:.1} s",
        gap.as_micros(),
        started.elapsed().as_secs_f64()
    );
    println!("ticker sleeping alone:        {:6.1} µs of CPU per message", per(alone));
    println!("ticker sleeping and sending:  {:6.1} µs", per(ticker));
    println!("receiver woken per message:   {:6.1} µs", per(receiver));
    println!(
        "one wake-up (the send, and the receiver's switch in and out): {:.1} µs of CPU",
        per(ticker.saturating_sub(alone) + receiver)
    );
}
