//! The `kvdir` binary. For now it answers `--help` and `--version`; the service itself arrives
//! with the streams issue.

use std::process::ExitCode;

const USAGE: &str = "\
kvdir: KV-cache directory and cache-aware router for xLLM clusters

USAGE:
    kvdir [--help | --version]

This build contains the core library only (event decoding and the tiered prefix index).
The service (subscriptions, query endpoint, routing) is not built yet.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("--help") | Some("-h") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some("--version") | Some("-V") => {
            println!("kvdir {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("error: unknown argument {other:?}; run `kvdir --help` for usage");
            ExitCode::from(2)
        }
    }
}
