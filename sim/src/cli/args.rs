//! Flag splitting and value parsing shared by `kvdir-sim` and `kvdir-bench`: xllm-service style
//! `--name=value` or `--name value`, with every problem named and collected.

use std::str::FromStr;

/// Splits arguments into `(name, value)` pairs, xllm-service style: `--name=value` or
/// `--name value`; a switch in `switches` given alone means `true`. `None` when `--help` or
/// `-h` appears. Malformed arguments are added to `problems`.
pub fn flag_pairs<I: IntoIterator<Item = String>>(
    args: I,
    switches: &[&str],
    problems: &mut Vec<String>,
) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return None;
        }
        let Some(flag) = arg.strip_prefix("--") else {
            problems.push(format!("unexpected argument {arg:?}; flags look like --name=value"));
            continue;
        };
        let pair = match flag.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None if switches.contains(&flag) => (flag.to_string(), "true".to_string()),
            None => match args.next_if(|next| !next.starts_with("--")) {
                Some(value) => (flag.to_string(), value),
                None => {
                    problems.push(format!("--{flag} needs a value"));
                    continue;
                }
            },
        };
        pairs.push(pair);
    }
    Some(pairs)
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
