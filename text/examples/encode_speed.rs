//! Encoding cost of fresh text with the demo model: `cargo run --release -p kvdir-text
//! --example encode_speed`. Each round encodes a different ~100k-token text made of the demo
//! corpus's words in a pseudo-random order (no piece repeats, so nothing is remembered), and
//! prints the time per token. Figures are in BENCHMARKS.md ("Front door").

use std::time::Instant;

use kvdir_text::{demo, TextModel};

/// Words of the corpus in an order given by `seed` (a small LCG), about `words` of them.
fn fresh_text(seed: u64, words: usize) -> String {
    let pool: Vec<&str> = demo::CORPUS.split_whitespace().collect();
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(words * 7);
    for _ in 0..words {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        out.push_str(pool[(x >> 33) as usize % pool.len()]);
        out.push(' ');
    }
    out
}

fn main() {
    let dir = std::env::temp_dir().join(format!("kvdir-encode-speed-{}", std::process::id()));
    demo::write_model(&dir).expect("the demo model is written");
    let model = TextModel::load(&dir, None).expect("the demo model loads");
    let _ = std::fs::remove_dir_all(&dir);
    for round in 0..5 {
        let text = fresh_text(round, 40_000);
        let started = Instant::now();
        let ids = model.encode(&text, false).expect("encodes");
        let took = started.elapsed();
        println!(
            "round {round}: {} tokens, {} bytes, {:.1} ms, {:.3} µs/token",
            ids.len(),
            text.len(),
            took.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e6 / ids.len() as f64
        );
    }
}
