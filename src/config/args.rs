//! Command lines of the workspace's binaries (`kvdir`, `kvdir-sim`, `kvdir-bench`), parsed by
//! clap with every problem reported at once: an argument clap rejects (an unknown flag, a
//! missing value, a value given to a switch) becomes a problem and is left out, and the rest is
//! parsed again ([`parse`]). Each binary declares its flags with clap's derive, keeps their
//! values as text, and checks them itself, so bad values join the same list. The value checks
//! the binaries share live here too ([`number`], [`choice`], [`rate`]).

use std::str::FromStr;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::ArgMatches;

/// `command` as every binary's is set up: a later occurrence of a flag overrides an earlier one,
/// values may look like negative numbers (so that the binary's check names them), and help is
/// wrapped at 100 columns. (Each binary names its flags `snake_case` in its derive.)
pub fn command(command: clap::Command) -> clap::Command {
    command.args_override_self(true).term_width(100).mut_args(|a| {
        let takes_value = a.get_action().takes_values();
        a.allow_negative_numbers(takes_value)
    })
}

/// What clap made of a command line: its matches, and the problems of the arguments it had to
/// leave out, each at its position on the command line.
pub struct Parsed<'a> {
    /// The matches of the arguments kept.
    pub matches: ArgMatches,
    /// Problems found so far, by position (`usize::MAX`: not on the command line).
    pub problems: Vec<(usize, String)>,
    /// The arguments kept, and their positions on the command line.
    args: Vec<(usize, &'a str)>,
}

/// A command line that is not to be run: `--help`, `--version`, or an error clap cannot place.
pub enum Early {
    /// `--help` or `-h`.
    Help,
    /// `--version` or `-V`.
    Version,
    /// Problems, the last one clap's own message.
    Fatal(Vec<(usize, String)>),
}

/// Parses `args` (after the program name) and the environment with `command`. An argument
/// clap rejects (an unknown flag, a missing value) becomes a problem and is left out, and the
/// rest is parsed again, so every problem is found in one run.
pub fn parse<'a>(command: &clap::Command, args: Vec<&'a str>) -> Result<Parsed<'a>, Early> {
    let mut args: Vec<(usize, &str)> = args.into_iter().enumerate().collect();
    let mut problems = Vec::new();
    let program = command.get_bin_name().unwrap_or(command.get_name()).to_string();
    loop {
        let argv = std::iter::once(command.get_name()).chain(args.iter().map(|(_, a)| *a));
        let error = match command.clone().try_get_matches_from(argv) {
            Ok(matches) => return Ok(Parsed { matches, problems, args }),
            Err(e) => e,
        };
        match error.kind() {
            ErrorKind::DisplayHelp => return Err(Early::Help),
            ErrorKind::DisplayVersion => return Err(Early::Version),
            _ => {}
        }
        let kept: Vec<&str> = args.iter().map(|(_, a)| *a).collect();
        let Some((at, n, problem)) = problem(&error, &kept, &program) else {
            problems.push((usize::MAX, error.render().to_string().trim().to_string()));
            return Err(Early::Fatal(problems));
        };
        problems.push((args[at].0, problem));
        args.drain(at..at + n);
    }
}

impl Parsed<'_> {
    /// Whether flag `id` was given, on the command line or in the environment.
    pub fn given(&self, id: &str) -> bool {
        let source = self.matches.value_source(id);
        matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    }

    /// Every value given on the command line, `(flag, value)` in command-line order (a
    /// switch's value is `true`), for binaries that apply flags one by one.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        for id in self.matches.ids() {
            let id = id.as_str();
            if self.matches.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            let (Some(at), Some(values)) = (self.matches.indices_of(id), self.matches.get_raw(id))
            else {
                continue;
            };
            for (i, v) in at.zip(values) {
                pairs.push((i, id.to_string(), v.to_string_lossy().into_owned()));
            }
        }
        pairs.sort_by_key(|(i, _, _)| *i);
        pairs.into_iter().map(|(_, id, v)| (id, v)).collect()
    }

    /// The positions on the command line of each occurrence of flag `id`.
    pub fn occurrences(&self, id: &str) -> Vec<usize> {
        let flag = format!("--{id}");
        let is = |a: &str| a == flag || a.split_once('=').is_some_and(|(n, _)| n == flag);
        self.args.iter().filter(|(_, a)| is(a)).map(|(at, _)| *at).collect()
    }
}

/// What went wrong in `error`, as a problem of the list, and how many of `args` (from `at`)
/// to leave out before parsing again; `None` when clap names no argument to leave out.
fn problem(error: &clap::Error, args: &[&str], program: &str) -> Option<(usize, usize, String)> {
    let invalid = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.as_str(),
        _ => return None,
    };
    // `--name <VALUE>` in clap's words: the flag is its first word.
    let flag = invalid.split_whitespace().next().unwrap_or(invalid);
    let at = args
        .iter()
        .position(|a| *a == flag || a.split_once('=').is_some_and(|(n, _)| n == flag))?;
    let name = flag.trim_start_matches('-');
    match error.kind() {
        ErrorKind::UnknownArgument if flag.starts_with('-') => {
            let hint = match error.get(ContextKind::SuggestedArg) {
                Some(ContextValue::String(s)) => format!(" (did you mean {s}?)"),
                _ => String::new(),
            };
            // `--bogus value` gives its value to the unknown flag, as `--bogus=value` does.
            let value =
                !args[at].contains('=') && args.get(at + 1).is_some_and(|v| !v.starts_with('-'));
            let problem = format!("unknown flag --{name}{hint}; run {program} --help for the list");
            Some((at, 1 + usize::from(value), problem))
        }
        ErrorKind::UnknownArgument => {
            Some((at, 1, format!("unexpected argument {flag:?}; flags look like --name=value")))
        }
        ErrorKind::InvalidValue | ErrorKind::NoEquals if !args[at].contains('=') => {
            Some((at, 1, format!("--{name} needs a value: --{name}=VALUE")))
        }
        ErrorKind::TooManyValues | ErrorKind::InvalidValue => {
            Some((at, 1, format!("--{name} takes no value")))
        }
        _ => None,
    }
}

/// Parses `value` of flag `--name`, naming both and the expected type on failure.
pub fn number<T: FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("--{name} = {value:?} is not a valid {}", std::any::type_name::<T>()))
}

/// Parses `value` of flag `--name` as one of `choices` (case-insensitive), naming the choices
/// on failure.
pub fn choice<T: Copy>(name: &str, value: &str, choices: &[(&str, T)]) -> Result<T, String> {
    let found = choices.iter().find(|(n, _)| n.eq_ignore_ascii_case(value));
    found.map(|(_, v)| *v).ok_or_else(|| {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        format!("--{name} = {value:?} is not one of {}", names.join(", "))
    })
}

/// Parses `value` of flag `--name` as a finite rate per second in `min..=max`, `unit` naming
/// what is counted (`token`, `request`), and naming all three on failure.
pub fn rate(name: &str, value: &str, (min, max): (f64, f64), unit: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if r.is_finite() && (min..=max).contains(&r) => Ok(r),
        _ if max == f64::MAX => Err(format!(
            "--{name}={value:?} is not a number of {unit}s per second of at least {min}"
        )),
        _ => Err(format!(
            "--{name}={value:?} is not a number of {unit}s per second in {min}..={max}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::{Arg, ArgAction};

    use super::*;

    fn tool() -> clap::Command {
        command(
            clap::Command::new("tool")
                .arg(Arg::new("rate").long("rate"))
                .arg(Arg::new("arg").long("arg").action(ArgAction::Append))
                .arg(Arg::new("json").long("json").action(ArgAction::SetTrue)),
        )
    }

    #[test]
    fn pairs_come_in_command_line_order_and_the_last_of_a_flag_wins() {
        let args = vec!["--arg=a", "--rate", "-1", "--json", "--arg", "b", "--rate=2"];
        let Ok(parsed) = parse(&tool(), args) else { panic!("parses") };
        let want = [("arg", "a"), ("json", "true"), ("arg", "b"), ("rate", "2")];
        assert_eq!(parsed.pairs(), want.map(|(n, v)| (n.to_string(), v.to_string())));
        assert_eq!(parsed.occurrences("rate"), [1, 6]);
    }

    #[test]
    fn every_argument_clap_rejects_is_a_problem_at_its_place() {
        let args = vec!["--rat=1", "--json=yes", "stray", "--rate"];
        assert!(matches!(parse(&tool(), vec!["--help"]), Err(Early::Help)));
        let Ok(parsed) = parse(&tool(), args) else { panic!("every problem is placed") };
        let problems: Vec<&str> = parsed.problems.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(
            problems,
            [
                "unknown flag --rat (did you mean --rate?); run tool --help for the list",
                "--json takes no value",
                "unexpected argument \"stray\"; flags look like --name=value",
                "--rate needs a value: --rate=VALUE",
            ]
        );
    }

    #[test]
    fn a_rate_names_its_unit_and_range() {
        assert_eq!(rate("r", "2.5", (0.0, 10.0), "request"), Ok(2.5));
        let high = rate("r", "11", (0.0, 10.0), "request").unwrap_err();
        assert_eq!(high, "--r=\"11\" is not a number of requests per second in 0..=10");
        let low = rate("r", "0.5", (1.0, f64::MAX), "token").unwrap_err();
        assert_eq!(low, "--r=\"0.5\" is not a number of tokens per second of at least 1");
    }
}
