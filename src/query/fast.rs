//! The query API's JSON on its hot path, without serde's per-element dispatch.
//!
//! A profile of the idle query (`kvdir-bench`, 128 streams, 1-9k-token prompts) put about 16 %
//! of kvdir's CPU in reading `token_ids` through serde (a visitor call per integer) and 19 % in
//! writing the 128-entry answer (serde_json escapes every key, byte by byte). So:
//! - [`plain_token_ids`] reads the usual body, `{"token_ids": [n, ...]}` and nothing else, with
//!   a plain scan. It accepts only what it is sure of: any other key, any element that is not a
//!   plain decimal integer in range, a list over the limit, or anything malformed gives `None`,
//!   and the serde path then reads the body and gives its exact answer or error message;
//! - [`answer_json`] writes a [`QueryResponse`](super::QueryResponse) (or its borrowed
//!   entries) with its keys as constants. Its bytes are those of `serde_json::to_vec` (the
//!   tests below compare them), and strings are escaped by serde_json itself.

use super::lanes;
use super::{MatchRef, QuerySummary};

/// The bytes after the opening brace of the only body the scan reads.
const KEY: &[u8] = b"\"token_ids\"";

/// A cursor over the body.
pub(super) struct Scan<'a> {
    pub(super) b: &'a [u8],
    pub(super) i: usize,
}

impl Scan<'_> {
    /// Skips JSON whitespace and returns the next byte, if any.
    pub(super) fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
        self.b.get(self.i).copied()
    }

    /// Consumes `c` after whitespace.
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A decimal integer in `0..=i32::MAX`, as JSON writes it (no sign, no leading zero).
    fn token(&mut self) -> Option<i32> {
        let start = self.i;
        let (v, digits) = match self.b.get(start..start + 8).and_then(short_number) {
            Some(parsed) => parsed,
            None => self.long_number()?,
        };
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        self.i = start + digits;
        i32::try_from(v).ok()
    }

    /// The list element at the cursor and its separator, consumed: the id, and whether `]`
    /// closed the list. The usual element is read from one word ([`quick_element`]), any other
    /// a byte at a time.
    #[inline(always)]
    pub(super) fn element(&mut self) -> Option<(i32, bool)> {
        if let Some((id, used, last)) = self.b.get(self.i..self.i + 8).and_then(quick_element) {
            self.i += used;
            return Some((id, last));
        }
        self.peek()?;
        let id = self.token()?;
        let last = match self.peek()? {
            b',' => false,
            b']' => true,
            _ => return None,
        };
        self.i += 1;
        Some((id, last))
    }

    /// The value and length of the digits at the cursor, a byte at a time: numbers of 8 digits
    /// or more, and the body's last bytes. More than 10 digits is no token id.
    fn long_number(&self) -> Option<(u64, usize)> {
        let rest = &self.b[self.i..];
        let digits = rest.iter().take(11).take_while(|d| d.is_ascii_digit()).count();
        let v = rest[..digits].iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
        (digits <= 10).then_some((v, digits))
    }
}

/// The value and length of the run of digits that `eight` starts with, if it is shorter than
/// 8, read in a few word operations instead of a loop per digit (a token id has 5-6 digits in a
/// 150k vocabulary, and the loop's exit branch mispredicts on every length change). The bytes
/// are read as one little-endian word, so the first character is its lowest byte:
/// - `x = word ^ 0x30..30` turns each digit into its value, 0 to 9, and any other byte into
///   something else; `((x + 0x76..76) | x) & 0x80..80` marks the bytes over 9. A carry out of a
///   byte can only disturb bytes after the first mark, so the lowest mark is exact and gives
///   the number of digits;
/// - shifting the digits to the top of the word puts zeros (leading zeros) below them, and
///   three multiply-and-shift steps then combine pairs, quads and halves of the eight
///   digit-bytes into the number.
fn short_number(eight: &[u8]) -> Option<(u64, usize)> {
    let x = u64::from_le_bytes(eight.try_into().ok()?) ^ 0x3030_3030_3030_3030;
    let digits = digit_count(x);
    if digits == 8 || digits == 0 {
        return (digits == 0).then_some((0, 0));
    }
    Some((digit_value(x, digits), digits))
}

/// How many of the bytes of `x` (a word `^ 0x30..30`, see [`short_number`]) are digits before
/// the first one that is not: 8 when all are.
#[inline(always)]
fn digit_count(x: u64) -> usize {
    let over_nine = (x.wrapping_add(0x7676_7676_7676_7676) | x) & 0x8080_8080_8080_8080;
    (over_nine.trailing_zeros() / 8) as usize
}

/// The number the first `digits` (1 to 8) bytes of `x` spell (see [`short_number`]).
#[inline(always)]
fn digit_value(x: u64, digits: usize) -> u64 {
    let mut v = x << (8 * (8 - digits));
    v = (v & 0x0f0f_0f0f_0f0f_0f0f).wrapping_mul(2561) >> 8;
    v = (v & 0x00ff_00ff_00ff_00ff).wrapping_mul(6_553_601) >> 16;
    (v & 0x0000_ffff_0000_ffff).wrapping_mul(42_949_672_960_001) >> 32
}

/// The usual element, read from one word: an id of 1 to 6 digits (no leading zero) and what
/// follows it, `,` (and one space, as Python's `json.dumps` writes) or `]`. Returns the id, the
/// bytes it and its separator take, and whether `]` closed the list; `None` for anything else,
/// which the byte-wise step then reads.
///
/// Why: the byte-wise step loads each element's bytes one after the other (skip whitespace,
/// the digits, whitespace, the separator), and every element's start waits for the one before:
/// about 13 ns per id here. Reading the separator from the word the digits came from leaves one
/// load per element on that path: about 8 ns (9,000 six-digit ids: 117 -> 70-80 µs). Finding
/// the commas a word at a time and parsing the elements between them independently measured
/// the same, with twice the code.
#[inline(always)]
fn quick_element(eight: &[u8]) -> Option<(i32, usize, bool)> {
    let word = u64::from_le_bytes(eight.try_into().ok()?);
    let x = word ^ 0x3030_3030_3030_3030;
    let digits = digit_count(x);
    if !(1..=6).contains(&digits) || (digits > 1 && word as u8 == b'0') {
        return None;
    }
    let id = digit_value(x, digits) as i32; // at most 999,999
    let after = |n: usize| (word >> (8 * n)) as u8;
    match after(digits) {
        b',' => Some((id, digits + 1 + usize::from(after(digits + 1) == b' '), false)),
        b']' => Some((id, digits + 1, true)),
        _ => None,
    }
}

/// The token ids of a body that is exactly `{"token_ids": [n, ...]}` (JSON whitespace
/// anywhere), with at most `max_tokens` ids; `None` for any other body (see the module
/// documentation).
pub(super) fn plain_token_ids(body: &[u8], max_tokens: usize) -> Option<Vec<i32>> {
    let mut s = Scan { b: body, i: 0 };
    s.eat(b'{')?;
    s.peek()?;
    if !body[s.i..].starts_with(KEY) {
        return None;
    }
    s.i += KEY.len();
    s.eat(b':')?;
    s.eat(b'[')?;
    if s.peek()? == b']' {
        s.i += 1;
        return end(s, Vec::new());
    }
    if body.len() - s.i >= lanes::MIN_BYTES {
        let out = lanes::ids_in_lanes(&mut s, max_tokens)?;
        return end(s, out);
    }
    // Every id takes at least two bytes ("1,"), so this never over-reserves by much.
    let mut out = Vec::with_capacity((body.len() / 2).min(max_tokens));
    loop {
        let (id, last) = s.element()?;
        if out.len() == max_tokens {
            return None;
        }
        out.push(id);
        if last {
            break;
        }
    }
    end(s, out)
}

/// `out`, if the body ends after the list with `}` and whitespace.
fn end(mut s: Scan<'_>, out: Vec<i32>) -> Option<Vec<i32>> {
    s.eat(b'}')?;
    (s.peek().is_none()).then_some(out)
}

/// `serde_json::to_vec` of the response with these entries, faster (see the module
/// documentation).
pub(super) fn answer_json<'a>(
    input_tokens: usize,
    matches: impl ExactSizeIterator<Item = MatchRef<'a>>,
    summary: Option<&QuerySummary>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + matches.len() * 256);
    out.extend_from_slice(b"{\"input_tokens\":");
    number(&mut out, input_tokens as u64);
    out.extend_from_slice(b",\"matches\":[");
    for (i, m) in matches.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        stream_match(&mut out, m);
    }
    out.push(b']');
    if let Some(s) = summary {
        out.extend_from_slice(b",\"summary\":");
        s.write_json(&mut out);
    }
    out.push(b'}');
    out
}

fn stream_match(out: &mut Vec<u8>, m: MatchRef<'_>) {
    out.extend_from_slice(b"{\"instance_name\":");
    string(out, m.instance_name);
    out.extend_from_slice(b",\"dp_rank\":");
    number(out, u64::from(m.dp_rank));
    out.extend_from_slice(match (m.synchronized, m.partial) {
        (true, false) => b",\"synchronized\":true,\"partial\":false,\"sequence\":",
        (true, true) => b",\"synchronized\":true,\"partial\":true,\"sequence\":",
        (false, false) => b",\"synchronized\":false,\"partial\":false,\"sequence\":",
        (false, true) => b",\"synchronized\":false,\"partial\":true,\"sequence\":",
    });
    match m.sequence {
        Some(s) => number(out, s),
        None => out.extend_from_slice(b"null"),
    }
    for (key, v) in [
        (&b",\"device_hit_tokens\":"[..], m.device_hit_tokens),
        (b",\"host_only_hit_tokens\":", m.host_only_hit_tokens),
        (b",\"reusable_prefix_tokens\":", m.reusable_prefix_tokens),
        (b",\"device_blocks\":", m.device_blocks),
        (b",\"host_blocks\":", m.host_blocks),
    ] {
        out.extend_from_slice(key);
        number(out, v);
    }
    out.extend_from_slice(b",\"error\":");
    match m.error {
        Some(e) => string(out, e),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(match m.approximate {
        true => b",\"approximate\":true}",
        false => b",\"approximate\":false}",
    });
}

fn number(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// A JSON string, escaped by serde_json.
fn string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string always serializes into a Vec");
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{parse_scoped_query, QueryResponse, StreamMatch};
    use super::*;

    fn plain(body: &str) -> Option<Vec<i32>> {
        plain_token_ids(body.as_bytes(), 5)
    }

    #[test]
    fn the_scan_reads_plain_bodies_and_leaves_everything_else_to_serde() {
        assert_eq!(plain(r#"{"token_ids":[1,2,2147483647]}"#), Some(vec![1, 2, i32::MAX]));
        assert_eq!(plain(" {\n\"token_ids\" :\t[ 0 , 10 ] } \r\n"), Some(vec![0, 10]));
        assert_eq!(plain(r#"{"token_ids":[]}"#), Some(vec![]));
        for other in [
            r#"{"token_ids":[1],"model":"m"}"#,
            r#"{"model":"m","token_ids":[1]}"#,
            r#"{"token_ids":[2147483648]}"#,
            r#"{"token_ids":[-1]}"#,
            r#"{"token_ids":[01]}"#,
            r#"{"token_ids":[1.5]}"#,
            r#"{"token_ids":[1e3]}"#,
            r#"{"token_ids":[1,]}"#,
            r#"{"token_ids":[,1]}"#,
            r#"{"token_ids":[1 2]}"#,
            r#"{"token_ids":[1,2,3,4,5,6]}"#,
            r#"{"token_ids":[1]} x"#,
            r#"{"token_ids":[1]"#,
            r#"{"token_ids":"1"}"#,
            r#"{"token\u005fids":[1]}"#,
            r#"{"token_ids":[99999999999999999999]}"#,
            "",
            "{",
        ] {
            assert_eq!(plain(other), None, "{other}");
        }
    }

    #[test]
    fn numbers_of_every_length_read_alike_in_words_and_bytes() {
        for v in [0u64, 7, 42, 100, 9_999, 12_345, 151_935, 1_234_567, 99_999_999, 2_147_483_647] {
            for tail in [",", "]", " ,", ",1234567", "]}\n       "] {
                let body = format!("{{\"token_ids\":[{v}{tail}");
                let mut s = Scan { b: body.as_bytes(), i: 14 };
                let want = i32::try_from(v).ok();
                assert_eq!((s.token(), s.i), (want, 14 + v.to_string().len()), "{body}");
            }
        }
        for bad in ["01,", "00]", "-1,", "a,", ",1"] {
            let padded = format!("{bad}       ");
            assert_eq!(Scan { b: padded.as_bytes(), i: 0 }.token(), None, "{bad}");
        }
        assert_eq!(short_number(b"12345678"), None, "8 digits or more go a byte at a time");
        assert_eq!(short_number(b"1234567,"), Some((1_234_567, 7)));
        assert_eq!(short_number(b",1234567"), Some((0, 0)));
        assert_eq!(short_number(b"9\xff\x00ab\x80cd"), Some((9, 1)));
    }

    #[test]
    fn the_one_word_element_takes_only_what_it_is_sure_of() {
        assert_eq!(quick_element(b"151935,7"), Some((151_935, 7, false)));
        assert_eq!(quick_element(b"151935, "), Some((151_935, 8, false)));
        assert_eq!(quick_element(b"0, 12345"), Some((0, 3, false)));
        assert_eq!(quick_element(b"7,  1234"), Some((7, 3, false)), "one space; the rest later");
        assert_eq!(quick_element(b"42]}    "), Some((42, 3, true)));
        for other in [
            &b"1234567,"[..],
            b"012,3456",
            b"00]     ",
            b" 12,3456",
            b"12 ,3456",
            b"12.5,345",
            b"-1,23456",
            b"123456",
        ] {
            assert_eq!(quick_element(other), None, "{}", String::from_utf8_lossy(other));
        }
        let many: Vec<String> = (0..500).map(|i| (i * 7_919 % 200_000).to_string()).collect();
        for sep in [",", ", ", " ,\n "] {
            let body = format!("{{\"token_ids\": [{}]}}", many.join(sep));
            let want: Vec<i32> = (0..500).map(|i| i * 7_919 % 200_000).collect();
            assert_eq!(plain_token_ids(body.as_bytes(), 500), Some(want), "{sep:?}");
            assert_eq!(plain_token_ids(body.as_bytes(), 499), None, "{sep:?}");
        }
        assert_eq!(plain(r#"{"token_ids": [1, 02]}"#), None);
    }

    fn whitespace() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof![Just(' '), Just('\n'), Just('\t'), Just('\r')], 0..3)
            .prop_map(|v| v.into_iter().collect())
    }

    fn body() -> impl Strategy<Value = String> {
        let id = prop_oneof![0..10, 0..1_000_000, 999_990..1_000_010, 0..=i32::MAX];
        let tokens = proptest::collection::vec(id, 0..=6);
        (tokens, whitespace(), whitespace()).prop_map(|(t, a, b)| {
            let list: Vec<String> = t.iter().map(|v| format!("{a}{v}{b}")).collect();
            format!("{a}{{{b}\"token_ids\"{a}:{b}[{}]{a}}}{b}", list.join(","))
        })
    }

    proptest! {
        /// A plain body is read by the scan, with serde's answer.
        #[test]
        fn the_scan_agrees_with_serde_on_plain_bodies(body in body()) {
            let full = parse_scoped_query(body.as_bytes(), 6).map(|(t, _)| t);
            let fast = plain_token_ids(body.as_bytes(), 6);
            prop_assert!(fast.is_some(), "{body}");
            prop_assert_eq!(fast, full.ok());
        }

        /// Whatever a damaged body is, the scan either declines it or agrees with serde.
        #[test]
        fn the_scan_never_contradicts_serde(
            body in body(),
            at in any::<prop::sample::Index>(),
            byte in prop_oneof![Just(b'-'), Just(b'.'), Just(b'0'), Just(b'"'), Just(b','),
                Just(b']'), Just(b'}'), Just(b'e'), Just(b' '), any::<u8>()],
        ) {
            let mut bytes = body.into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            if let Some(tokens) = plain_token_ids(&bytes, 6) {
                let (full, scope) = parse_scoped_query(&bytes, 6).expect("serde accepts it too");
                prop_assert_eq!(tokens, full);
                prop_assert_eq!(scope, Default::default());
            }
        }

        /// The writer's bytes are serde_json's.
        #[test]
        fn the_writer_matches_serde_json(
            input_tokens in any::<u32>(),
            matches in proptest::collection::vec(stream_match_strategy(), 0..4),
            summary in proptest::option::of(any::<[u64; 5]>()),
        ) {
            let summary = summary.map(|n| QuerySummary {
                streams: n[0],
                with_credit: n[1],
                unlisted_with_credit: n[2],
                zero_credit: n[3],
                unsynchronized: n[4],
            });
            let r = QueryResponse { input_tokens: input_tokens as usize, matches, summary };
            prop_assert_eq!(
                String::from_utf8(r.to_json()).unwrap(),
                serde_json::to_string(&r).unwrap()
            );
        }
    }

    fn stream_match_strategy() -> impl Strategy<Value = StreamMatch> {
        (
            (any::<String>(), any::<u32>(), any::<(bool, bool)>(), any::<Option<u64>>()),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            (any::<Option<String>>(), any::<bool>()),
        )
            .prop_map(
                |(
                    (instance_name, dp_rank, (synchronized, partial), sequence),
                    n,
                    (error, approximate),
                )| {
                    StreamMatch {
                        instance_name,
                        dp_rank,
                        synchronized,
                        partial,
                        sequence,
                        device_hit_tokens: n.0,
                        host_only_hit_tokens: n.1,
                        reusable_prefix_tokens: n.2,
                        device_blocks: n.3,
                        host_blocks: n.4,
                        error,
                        approximate,
                    }
                },
            )
    }
}
