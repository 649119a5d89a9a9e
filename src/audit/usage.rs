//! Reading an engine's answer for `usage.prompt_tokens_details.cached_tokens` as it passes
//! through, without holding it: [`UsageTap`] sees every chunk once.
//!
//! - **SSE** (`stream: true`): the answer is cut into lines; only complete `data:` lines that
//!   contain `"prompt_tokens"` are parsed (a usage object always has it; token chunks carry
//!   `"usage": null` or nothing), so the cost per chunk is one scan for newlines and one for
//!   that word. The last usage seen wins (the final usage chunk). At most the current
//!   incomplete line is held, up to [`MAX_LINE_BYTES`]; a longer line is not inspected.
//! - **Stripping**: when kvdir itself asked for usage ([`ask_for_usage`]) the client must not
//!   see the usage-only chunk (`"choices": []` with a usage object), so the tap drops that
//!   `data:` line and the blank line that ends its event, and passes everything else byte for
//!   byte. An incomplete line is held back until its newline (a client cannot use half an
//!   event either); a chunk of whole lines with nothing to drop passes as it is
//!   ([`Pass::Whole`]).
//! - **JSON** (`stream: false`): the last [`TAIL_BYTES`] of the body are kept; at the end the
//!   whole body, when it fit, or else the last `"usage"` object in the tail, is parsed.

use serde_json::Value;

/// What one answer said about its cached prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// `usage.prompt_tokens_details.cached_tokens`.
    Tokens(u64),
    /// A usage object without it (vLLM without `--enable-prompt-tokens-details`), or no usage.
    Absent,
}

/// The longest SSE line inspected; longer ones pass uninspected.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The tail of a JSON answer kept for its usage.
pub const TAIL_BYTES: usize = 64 << 10;

/// What to pass to the client for one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// The chunk as it came.
    Whole,
    /// These bytes instead (possibly none).
    Part(Vec<u8>),
}

/// The request `body` (a JSON object) with `stream_options.include_usage` set to true, for a
/// streaming request whose client did not ask for usage. `has_stream_options`: whether the body
/// has a `stream_options` key (then it is parsed and re-serialized; otherwise the key is
/// inserted after the opening brace and every other byte stays). `None` when the body is not a
/// JSON object.
pub fn ask_for_usage(body: &[u8], has_stream_options: bool) -> Option<Vec<u8>> {
    if has_stream_options {
        let mut v: Value = serde_json::from_slice(body).ok()?;
        let options = v.as_object_mut()?.get_mut("stream_options")?;
        if !options.is_object() {
            *options = Value::Object(serde_json::Map::new());
        }
        options.as_object_mut()?.insert("include_usage".into(), Value::Bool(true));
        return serde_json::to_vec(&v).ok();
    }
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    let rest = &body[open + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let key: &[u8] = if empty {
        br#""stream_options":{"include_usage":true}"#
    } else {
        br#""stream_options":{"include_usage":true},"#
    };
    let mut out = Vec::with_capacity(body.len() + key.len());
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(key);
    out.extend_from_slice(rest);
    Some(out)
}

/// Reads the usage of one answer as it streams through.
#[derive(Debug)]
pub struct UsageTap {
    sse: bool,
    strip: bool,
    /// SSE: the current incomplete line (not yet passed on when stripping). JSON: the tail.
    held: Vec<u8>,
    /// SSE: the current line outgrew [`MAX_LINE_BYTES`]; it passes uninspected to its newline.
    overlong: bool,
    /// SSE: a usage line was just dropped; drop the blank line that ends its event.
    drop_blank: bool,
    /// JSON: whether bytes fell out of the tail.
    truncated: bool,
    found: Option<Reported>,
}

impl UsageTap {
    /// A tap for an SSE answer; `strip` drops the usage-only chunk.
    pub fn sse(strip: bool) -> UsageTap {
        UsageTap::new(true, strip)
    }

    /// A tap for a JSON answer.
    pub fn json() -> UsageTap {
        UsageTap::new(false, false)
    }

    fn new(sse: bool, strip: bool) -> UsageTap {
        let (held, overlong, drop_blank, truncated) = (Vec::new(), false, false, false);
        UsageTap { sse, strip, held, overlong, drop_blank, truncated, found: None }
    }

    /// Takes the next chunk of the answer; what to pass on.
    pub fn feed(&mut self, chunk: &[u8]) -> Pass {
        if !self.sse {
            self.keep_tail(chunk);
            return Pass::Whole;
        }
        // Stays `None` while the output equals the chunk so far.
        let mut out: Option<Vec<u8>> = None;
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            let piece = &chunk[start..=nl];
            if self.overlong {
                self.overlong = false;
                extend(&mut out, piece);
            } else if !self.held.is_empty() {
                // Only the first line of a chunk continues a held one (`start` is 0).
                let mut line = std::mem::take(&mut self.held);
                line.extend_from_slice(piece);
                let keep = self.line(&line);
                if self.strip {
                    let o = out.get_or_insert_with(Vec::new);
                    if keep {
                        o.extend_from_slice(&line);
                    }
                }
            } else if self.line(piece) {
                extend(&mut out, piece);
            } else {
                out.get_or_insert_with(|| chunk[..start].to_vec());
            }
            start = nl + 1;
        }
        self.rest(&chunk[start..], &mut out, &chunk[..start]);
        out.map_or(Pass::Whole, Pass::Part)
    }

    /// The bytes after a chunk's last newline: held, or passed when the line is too long.
    fn rest(&mut self, rest: &[u8], out: &mut Option<Vec<u8>>, before: &[u8]) {
        if rest.is_empty() {
            return;
        }
        if self.overlong {
            extend(out, rest);
        } else if self.held.len() + rest.len() > MAX_LINE_BYTES {
            self.overlong = true;
            let held = std::mem::take(&mut self.held);
            if self.strip {
                let o = out.get_or_insert_with(|| before.to_vec());
                o.extend_from_slice(&held);
                o.extend_from_slice(rest);
            }
        } else {
            self.held.extend_from_slice(rest);
            if self.strip {
                out.get_or_insert_with(|| before.to_vec());
            }
        }
    }

    /// Inspects one line (with its newline); whether to pass it on.
    fn line(&mut self, line: &[u8]) -> bool {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if std::mem::take(&mut self.drop_blank) && text.is_empty() {
            return false;
        }
        let Some(data) = text.strip_prefix(b"data:") else { return true };
        if memchr::memmem::find(data, br#""prompt_tokens""#).is_none() {
            return true;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else { return true };
        let Some(usage) = v.get("usage").filter(|u| u.is_object()) else { return true };
        self.found = Some(cached_of(usage));
        let usage_only = v.get("choices").is_none_or(|c| c.as_array().is_some_and(Vec::is_empty));
        if self.strip && usage_only {
            self.drop_blank = true;
            return false;
        }
        true
    }

    fn keep_tail(&mut self, chunk: &[u8]) {
        self.held.extend_from_slice(chunk);
        // Trimmed in steps of TAIL_BYTES, so each byte moves at most once or twice.
        if self.held.len() > 2 * TAIL_BYTES {
            self.held.drain(..self.held.len() - TAIL_BYTES);
            self.truncated = true;
        }
    }

    /// The answer ended: the bytes still held (to pass on), and what it reported (`Absent`
    /// when it carried no usage at all).
    pub fn finish(mut self) -> (Vec<u8>, Reported) {
        if !self.sse {
            return (Vec::new(), self.json_usage().unwrap_or(Reported::Absent));
        }
        let line = std::mem::take(&mut self.held);
        let keep = line.is_empty() || self.line(&line);
        let flush = if self.strip && keep { line } else { Vec::new() };
        (flush, self.found.unwrap_or(Reported::Absent))
    }

    /// The whole body's usage when it fit in the tail, else the last `"usage"` object in it.
    fn json_usage(&self) -> Option<Reported> {
        if !self.truncated {
            let v: Value = serde_json::from_slice(&self.held).ok()?;
            return v.get("usage").filter(|u| u.is_object()).map(cached_of);
        }
        let mut end = self.held.len();
        while let Some(at) = memchr::memmem::rfind(&self.held[..end], br#""usage""#) {
            let after = &self.held[at + 7..];
            let after = &after[after.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
            if let Some(value) = after.strip_prefix(b":") {
                let mut values = serde_json::Deserializer::from_slice(value).into_iter::<Value>();
                if let Some(Ok(usage)) = values.next() {
                    if usage.is_object() {
                        return Some(cached_of(&usage));
                    }
                }
            }
            end = at;
        }
        None
    }
}

/// Appends `piece` to a diverged output; nothing while the output still equals the chunk.
fn extend(out: &mut Option<Vec<u8>>, piece: &[u8]) {
    if let Some(o) = out {
        o.extend_from_slice(piece);
    }
}

/// `prompt_tokens_details.cached_tokens` of a usage object.
fn cached_of(usage: &Value) -> Reported {
    let cached = usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens"));
    cached.and_then(Value::as_u64).map_or(Reported::Absent, Reported::Tokens)
}
