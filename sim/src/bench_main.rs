//! The `kvdir-bench` binary: parses flags, runs the load against kvdir
//! ([`kvdir_sim::bench::run`]) and prints the report, as text or with `--json` as JSON.
//! Exit codes: 0 after a report, 1 when the run failed, 2 for bad flags.

use std::process::ExitCode;

use kvdir_sim::bench::{self, BenchCommand};

fn main() -> ExitCode {
    let options = match bench::parse_args(std::env::args().skip(1)) {
        Ok(BenchCommand::Help) => {
            print!("{}", bench::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(BenchCommand::Run(options)) => options,
        Err(e) => {
            eprintln!("kvdir-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match bench::run(&options) {
        Ok(report) if options.json => {
            println!("{:#}", report.json());
            ExitCode::SUCCESS
        }
        Ok(report) => {
            print!("{}", report.text());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvdir-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
