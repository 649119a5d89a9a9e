//! A small reader of the Prometheus text exposition format (what `/metrics` of vLLM and SGLang
//! answers): `name{label="value",...} value [timestamp]` per line, `#` lines and blank lines
//! skipped. Only what kvdir needs: the samples of a few named metrics, summed or maximised over
//! their label sets. Input is hostile: a line that does not parse is skipped and counted, never
//! a panic.

/// One sample: the metric name, its label text (between the braces, unparsed) and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// The metric name, such as `vllm:num_requests_waiting`.
    pub name: &'a str,
    /// The text between `{` and `}`, empty without labels.
    pub labels: &'a str,
    /// The value (`NaN`, `+Inf` and `-Inf` included).
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, escapes left as written (`None` when absent).
    pub fn label(&self, key: &str) -> Option<&'a str> {
        let mut rest = self.labels;
        while !rest.is_empty() {
            let (name, after) = rest.split_once("=\"")?;
            let end =
                after.char_indices().find(|(i, c)| *c == '"' && !after[..*i].ends_with('\\'))?.0;
            if name.trim().trim_start_matches(',').trim() == key {
                return Some(&after[..end]);
            }
            rest = after[end + 1..].trim_start_matches(',');
        }
        None
    }
}

/// The samples of an exposition text, and how many non-comment lines did not parse.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples<'a> {
    /// In text order.
    pub samples: Vec<Sample<'a>>,
    /// Lines skipped as malformed.
    pub malformed: usize,
}

impl<'a> Samples<'a> {
    /// Reads every sample of `text`.
    pub fn parse(text: &'a str) -> Self {
        let mut out = Samples::default();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match sample(line) {
                Some(s) => out.samples.push(s),
                None => out.malformed += 1,
            }
        }
        out
    }

    /// The finite values of `name`, one per label set.
    fn values(&self, name: &str) -> impl Iterator<Item = f64> + '_ {
        let name = name.to_string();
        self.samples.iter().filter(move |s| s.name == name && s.value.is_finite()).map(|s| s.value)
    }

    /// The sum of `name` over its label sets (for example the DP ranks of one server), or
    /// `None` when it has no finite sample.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.values(name).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
    }

    /// The largest value of `name` over its label sets, or `None`.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.values(name).fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))))
    }
}

/// One sample line, or `None` when it is malformed.
fn sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_name(name) {
        return None;
    }
    let rest = &line[name_end..];
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => {
            let close = label_end(inner)?;
            (&inner[..close], &inner[close + 1..])
        }
        None => ("", rest),
    };
    let value = rest.split_whitespace().next()?;
    Some(Sample { name, labels, value: number(value)? })
}

/// Metric names: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The index of the `}` that closes a label set, skipping quoted values with escapes.
fn label_end(inner: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// A sample value: a float, or `NaN`, `+Inf`, `-Inf`.
fn number(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_labels_and_special_values() {
        let text = "# HELP x_total A counter.\n# TYPE x_total counter\n\
                    x_total 3\n\
                    y{a=\"1\",b=\"q\\\"}uoted\"} 2.5e0 1700000000000\n\
                    y{a=\"2\"} +Inf\n\
                    z NaN\n\
                    \n\
                    bad line here\n\
                    9starts_with_digit 1\n\
                    unclosed{a=\"1\" 2\n";
        let s = Samples::parse(text);
        assert_eq!(s.samples.len(), 4, "{s:?}");
        assert_eq!(s.malformed, 3);
        assert_eq!(s.samples[1].labels, "a=\"1\",b=\"q\\\"}uoted\"");
        assert_eq!(
            (s.samples[1].label("a"), s.samples[1].label("b")),
            (Some("1"), Some("q\\\"}uoted"))
        );
        assert_eq!(s.samples[1].label("c"), None);
        assert_eq!(s.sum("x_total"), Some(3.0));
        assert_eq!(s.sum("y"), Some(2.5), "infinite values are left out");
        assert_eq!(s.sum("z"), None, "NaN is no value");
        assert_eq!(s.sum("absent"), None);
    }

    #[test]
    fn sum_and_max_over_label_sets() {
        let s = Samples::parse("g{r=\"0\"} 1\ng{r=\"1\"} 4\ng{r=\"2\"} 2\n");
        assert_eq!((s.sum("g"), s.max("g")), (Some(7.0), Some(4.0)));
    }
}
