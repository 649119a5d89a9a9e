//! The `kvdir-bench` binary: parses flags, runs the load against kvdir
//! ([`kvdir_bench::run`]) or, as `kvdir-bench replay ...`, replays a trace
//! ([`kvdir_bench::replay::run`]) or, as `kvdir-bench chat ...`, sends chat requests through
//! kvdir's OpenAI front door ([`kvdir_bench::chat::run`]), and prints the report, as text
//! or with `--json` as JSON.
//! Exit codes: 0 after a report, 1 when the run failed, 2 for bad flags.

use std::process::ExitCode;

use kvdir_bench as bench;
use kvdir_bench::chat::{self, ChatCommand};
use kvdir_bench::replay::{self, ReplayCommand};
use kvdir_bench::{BenchCommand, BenchError};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    if args.next_if(|a| a == "replay").is_some() {
        return replay_main(args);
    }
    if args.next_if(|a| a == "chat").is_some() {
        return chat_main(args);
    }
    let options = match bench::parse_args(args) {
        Ok(BenchCommand::Help) => {
            print!("{}", bench::help());
            return ExitCode::SUCCESS;
        }
        Ok(BenchCommand::Run(options)) => options,
        Err(e) => return flags_failed(e),
    };
    match bench::run(&options) {
        Ok(report) if options.json => print_ok(format!("{:#}\n", report.json())),
        Ok(report) => print_ok(report.text()),
        Err(e) => failed(e),
    }
}

fn replay_main(args: impl Iterator<Item = String>) -> ExitCode {
    let options = match replay::parse_replay_args(args) {
        Ok(ReplayCommand::Help) => return print_ok(replay::replay_help()),
        Ok(ReplayCommand::Run(options)) => options,
        Err(e) => return flags_failed(e),
    };
    match replay::run(&options) {
        Ok(report) if options.kvdir.json => print_ok(format!("{:#}\n", report.json())),
        Ok(report) => print_ok(report.text()),
        Err(e) => failed(e),
    }
}

fn chat_main(args: impl Iterator<Item = String>) -> ExitCode {
    let options = match chat::parse_chat_args(args) {
        Ok(ChatCommand::Help) => return print_ok(chat::chat_help()),
        Ok(ChatCommand::Run(options)) => options,
        Err(e) => return flags_failed(e),
    };
    match chat::run(&options) {
        Ok(report) if options.kvdir.json => print_ok(format!("{:#}\n", report.json())),
        Ok(report) => print_ok(report.text()),
        Err(e) => failed(e),
    }
}

fn print_ok(text: String) -> ExitCode {
    print!("{text}");
    ExitCode::SUCCESS
}

fn flags_failed(e: BenchError) -> ExitCode {
    eprintln!("kvdir-bench: {e}");
    ExitCode::from(2)
}

fn failed(e: BenchError) -> ExitCode {
    eprintln!("kvdir-bench: {e}");
    ExitCode::FAILURE
}
