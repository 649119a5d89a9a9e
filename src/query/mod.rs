//! The internal query API's input and output (protocol.md section 6), without any HTTP.
//!
//! Input is `{"token_ids": [int, ...]}` with an optional scope ([`QueryScope`]: model, LoRA
//! adapter, salt, tenant, instance, block size; other keys are ignored) and `list`, how the
//! answer lists the streams ([`ListMode`]: every one, or past [`LIST_THRESHOLD`] only those
//! holding a prefix and a [`QuerySummary`], `compact.rs`). Token ids must be integers in
//! `0..=i32::MAX`, and the list no longer than the configured limit; every violation is a
//! [`QueryError`] that says which element is wrong. The decoder checks elements as it reads
//! them, so a 1 M-token body is validated without building a JSON tree.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::index::{Namespace, StreamLabel};

mod compact;
mod fast;
mod lanes;

pub use compact::{longest_first, ListMode, QuerySummary, LIST_THRESHOLD};

/// Why a query body was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueryError {
    /// The body is not the expected JSON.
    #[error("{0}")]
    Invalid(String),
}

/// Parses and validates a query body.
pub fn parse_query(body: &[u8], max_tokens: usize) -> Result<Vec<i32>, QueryError> {
    parse_scoped_query(body, max_tokens).map(|(tokens, _)| tokens)
}

/// Which streams a query is for and in which key namespace (protocol.md section 1.1): the
/// optional `model`, `lora_name` (or `lora_id`), `cache_salt`, `tenant_id`, `instance_id` and
/// `block_size` of a query body. Empty or absent fields select everything, as before them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryScope {
    /// Only streams of this model, and streams that name no model; empty: every stream.
    pub model: String,
    /// The key namespace: the adapter and the salt.
    pub namespace: Namespace,
    /// Only streams of this tenant (`"default"` for streams registered without one).
    pub tenant: Option<String>,
    /// Only this instance's streams.
    pub instance: Option<String>,
    /// Only streams of this block size.
    pub block_size: Option<u32>,
    /// How the answer lists the streams in scope.
    pub list: ListMode,
}

/// The tenant of streams registered without `tenant_id`.
pub const DEFAULT_TENANT: &str = "default";

impl QueryScope {
    /// Whether a stream labelled `label`, of `block_size`, is in scope.
    pub fn admits(&self, label: &StreamLabel, block_size: u32) -> bool {
        let tenant = if label.tenant.is_empty() { DEFAULT_TENANT } else { &label.tenant };
        (self.model.is_empty() || label.model.is_empty() || label.model == self.model)
            && self.tenant.as_ref().is_none_or(|t| t == tenant)
            && self.instance.as_ref().is_none_or(|i| *i == label.instance_name)
            && self.admits_block_size(block_size)
    }

    /// Whether streams of `block_size` may be in scope (the only filter on a whole index).
    pub fn admits_block_size(&self, block_size: u32) -> bool {
        self.block_size.is_none_or(|b| b == block_size)
    }

    /// Whether the scope admits every stream of a block size it admits, whatever its label.
    pub fn admits_every_label(&self) -> bool {
        self.model.is_empty() && self.tenant.is_none() && self.instance.is_none()
    }
}

/// [`parse_query`], plus the query's [`QueryScope`].
pub fn parse_scoped_query(
    body: &[u8],
    max_tokens: usize,
) -> Result<(Vec<i32>, QueryScope), QueryError> {
    // The usual body, `{"token_ids": [...]}` alone, is read by a plain scan; anything else (and
    // every error, so that the messages stay serde_json's and the visitor's) by serde below.
    if let Some(tokens) = fast::plain_token_ids(body, max_tokens) {
        return Ok((tokens, QueryBody::default().scope()));
    }
    let mut b = match serde_json::from_slice::<QueryBody>(body) {
        Ok(b) => b,
        // serde_json appends " at line L column C", which helps find the element.
        Err(e) => return Err(QueryError::Invalid(e.to_string())),
    };
    let tokens = match b.token_ids.take() {
        Some(t) if t.0.len() > max_tokens => {
            return Err(QueryError::Invalid(format!(
                "token_ids has {} tokens, more than the --max_query_tokens limit {max_tokens}",
                t.0.len()
            )))
        }
        Some(t) => t.0,
        None => {
            return Err(QueryError::Invalid(
                "token_ids is missing; send {\"token_ids\": [1, 2, ...]}".into(),
            ))
        }
    };
    Ok((tokens, b.scope()))
}

#[derive(Default, Deserialize)]
struct QueryBody {
    token_ids: Option<TokenIds>,
    model: Option<String>,
    lora_name: Option<String>,
    lora_id: Option<i64>,
    cache_salt: Option<String>,
    tenant_id: Option<String>,
    instance_id: Option<String>,
    block_size: Option<u32>,
    list: Option<ListMode>,
}

impl QueryBody {
    /// The scope the body's optional fields select.
    fn scope(self) -> QueryScope {
        let lora = match (self.lora_name.as_deref().unwrap_or_default(), self.lora_id) {
            ("", Some(id)) => Namespace::lora_id(id),
            (name, _) => Namespace::lora_name(name.as_bytes()),
        };
        let salt = Namespace::salt(self.cache_salt.as_deref().unwrap_or_default().as_bytes());
        QueryScope {
            model: self.model.unwrap_or_default(),
            namespace: Namespace { lora, salt },
            tenant: self.tenant_id.filter(|t| !t.is_empty()),
            instance: self.instance_id.filter(|i| !i.is_empty()),
            block_size: self.block_size.filter(|&n| n > 0),
            list: self.list.unwrap_or_default(),
        }
    }
}

struct TokenIds(Vec<i32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TokenVisitor)
    }
}

struct TokenVisitor;

impl<'de> Visitor<'de> for TokenVisitor {
    type Value = TokenIds;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("token_ids as an array of integers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(t) = seq.next_element::<TokenId>()? {
            match t.0 {
                Ok(v) => out.push(v),
                Err(msg) => {
                    return Err(de::Error::custom(format_args!("token_ids[{}] {msg}", out.len())))
                }
            }
        }
        Ok(TokenIds(out))
    }
}

/// One element: a token id, or why it is not one.
struct TokenId(Result<i32, String>);

impl<'de> Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TokenIdVisitor)
    }
}

struct TokenIdVisitor;

const RANGE: &str = "is outside 0..=2147483647";

impl<'de> Visitor<'de> for TokenIdVisitor {
    type Value = TokenId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token id (an integer in 0..=2147483647)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<TokenId, E> {
        Ok(TokenId(i32::try_from(v).map_err(|_| format!("= {v} {RANGE}"))))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<TokenId, E> {
        Ok(TokenId(match i32::try_from(v) {
            Ok(t) if t >= 0 => Ok(t),
            _ => Err(format!("= {v} {RANGE}")),
        }))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<TokenId, E> {
        Ok(TokenId(Err(format!("= {v} is not an integer"))))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<TokenId, E> {
        Ok(TokenId(Err(format!("= {v:?} is a string; token ids are integers (tokenize first)"))))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<TokenId, E> {
        Ok(TokenId(Err(format!("= {v} is not an integer"))))
    }

    fn visit_unit<E: de::Error>(self) -> Result<TokenId, E> {
        Ok(TokenId(Err("is null, not an integer".into())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<TokenId, A::Error> {
        Ok(TokenId(Err("is an array, not an integer".into())))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<TokenId, A::Error> {
        Ok(TokenId(Err("is an object, not an integer".into())))
    }
}

/// One stream's entry in a query response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMatch {
    /// The instance.
    pub instance_name: String,
    /// Its DP rank.
    pub dp_rank: u32,
    /// Valid snapshot plus continuous deltas; false means all hit fields are 0.
    pub synchronized: bool,
    /// History replay only: the stream knows only the blocks learned since a truncated
    /// history (docs/protocol.md section 3.1); its hits are real but may be short.
    #[serde(default)]
    pub partial: bool,
    /// Last applied sequence.
    pub sequence: Option<u64>,
    /// Tokens of the matched prefix whose blocks are on Device.
    pub device_hit_tokens: u64,
    /// Tokens of the matched prefix whose blocks are only on Host.
    pub host_only_hit_tokens: u64,
    /// Their sum; a block on both tiers counts once.
    pub reusable_prefix_tokens: u64,
    /// Resident Device blocks.
    pub device_blocks: u64,
    /// Resident Host blocks.
    pub host_blocks: u64,
    /// Why the stream is unsynchronized.
    pub error: Option<String>,
    /// No stream: the engine publishes no KV events, and these hits are kvdir's approximate
    /// credit from its own routing (`kvdir::car::ApproxCache`).
    #[serde(default)]
    pub approximate: bool,
}

/// A query response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryResponse {
    /// Tokens in the query.
    pub input_tokens: usize,
    /// One entry per instance/DP, ordered by instance name then rank; in a compact answer
    /// only the streams holding a prefix, longest first.
    pub matches: Vec<StreamMatch>,
    /// A compact answer's summary of every stream in scope (absent when all are listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<QuerySummary>,
}

impl QueryResponse {
    /// The response's JSON: the bytes of `serde_json::to_vec(self)`, written faster (a
    /// 128-stream answer is written on every query).
    pub fn to_json(&self) -> Vec<u8> {
        let matches = self.matches.iter().map(StreamMatch::borrowed);
        answer_json(self.input_tokens, matches, self.summary.as_ref())
    }
}

/// A [`StreamMatch`] whose strings are borrowed: what the service writes an answer from, so
/// that a query copies no instance name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchRef<'a> {
    /// The instance.
    pub instance_name: &'a str,
    /// Its DP rank.
    pub dp_rank: u32,
    /// Valid snapshot plus continuous deltas.
    pub synchronized: bool,
    /// Knows only the blocks learned since a truncated history.
    pub partial: bool,
    /// Last applied sequence.
    pub sequence: Option<u64>,
    /// Tokens of the matched prefix whose blocks are on Device.
    pub device_hit_tokens: u64,
    /// Tokens of the matched prefix whose blocks are only on Host.
    pub host_only_hit_tokens: u64,
    /// Their sum.
    pub reusable_prefix_tokens: u64,
    /// Resident Device blocks.
    pub device_blocks: u64,
    /// Resident Host blocks.
    pub host_blocks: u64,
    /// Why the stream is unsynchronized.
    pub error: Option<&'a str>,
    /// Approximate credit of an engine without KV events.
    pub approximate: bool,
}

impl StreamMatch {
    /// This entry, borrowed.
    pub fn borrowed(&self) -> MatchRef<'_> {
        MatchRef {
            instance_name: &self.instance_name,
            dp_rank: self.dp_rank,
            synchronized: self.synchronized,
            partial: self.partial,
            sequence: self.sequence,
            device_hit_tokens: self.device_hit_tokens,
            host_only_hit_tokens: self.host_only_hit_tokens,
            reusable_prefix_tokens: self.reusable_prefix_tokens,
            device_blocks: self.device_blocks,
            host_blocks: self.host_blocks,
            error: self.error.as_deref(),
            approximate: self.approximate,
        }
    }
}

impl From<MatchRef<'_>> for StreamMatch {
    fn from(m: MatchRef<'_>) -> Self {
        StreamMatch {
            instance_name: m.instance_name.to_owned(),
            dp_rank: m.dp_rank,
            synchronized: m.synchronized,
            partial: m.partial,
            sequence: m.sequence,
            device_hit_tokens: m.device_hit_tokens,
            host_only_hit_tokens: m.host_only_hit_tokens,
            reusable_prefix_tokens: m.reusable_prefix_tokens,
            device_blocks: m.device_blocks,
            host_blocks: m.host_blocks,
            error: m.error.map(str::to_owned),
            approximate: m.approximate,
        }
    }
}

/// The JSON of a [`QueryResponse`] with these entries, in order, and this summary: the bytes
/// `serde_json` gives for it, written with constant keys.
pub fn answer_json<'a>(
    input_tokens: usize,
    matches: impl ExactSizeIterator<Item = MatchRef<'a>>,
    summary: Option<&QuerySummary>,
) -> Vec<u8> {
    fast::answer_json(input_tokens, matches, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse_query(body.as_bytes(), 5).unwrap_err().to_string()
    }

    #[test]
    fn accepts_token_lists_and_ignores_other_keys() {
        assert_eq!(parse_query(br#"{"token_ids":[1,2,2147483647]}"#, 5), Ok(vec![1, 2, i32::MAX]));
        assert_eq!(parse_query(br#"{"model":"x","token_ids":[]}"#, 5), Ok(vec![]));
    }

    #[test]
    fn the_list_mode_is_read_and_a_bad_one_named() {
        let scope = |body: &str| parse_scoped_query(body.as_bytes(), 5).map(|(_, s)| s.list);
        assert_eq!(scope(r#"{"token_ids":[1]}"#), Ok(ListMode::Auto));
        assert_eq!(scope(r#"{"token_ids":[1],"list":"all"}"#), Ok(ListMode::All));
        assert_eq!(scope(r#"{"list":"compact","token_ids":[]}"#), Ok(ListMode::Compact));
        let e = scope(r#"{"token_ids":[1],"list":"every"}"#).unwrap_err().to_string();
        assert!(e.contains("unknown variant `every`") && e.contains("`compact`"), "{e}");
    }

    #[test]
    fn rejects_bad_tokens_naming_the_element() {
        assert!(err(r#"{"token_ids":[1,-1]}"#)
            .starts_with("token_ids[1] = -1 is outside 0..=2147483647"));
        assert!(err(r#"{"token_ids":[2147483648]}"#)
            .starts_with("token_ids[0] = 2147483648 is outside"));
        assert!(err(r#"{"token_ids":[1.5]}"#).starts_with("token_ids[0] = 1.5 is not an integer"));
        assert!(err(r#"{"token_ids":["hi"]}"#).starts_with("token_ids[0] = \"hi\" is a string"));
        assert!(err(r#"{"token_ids":[null]}"#).starts_with("token_ids[0] is null"));
        assert!(err(r#"{"token_ids":[1,2,3,4,5,6]}"#)
            .starts_with("token_ids has 6 tokens, more than the --max_query_tokens limit 5"));
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(err(r#"{"token_ids":"1,2"}"#).contains("token_ids as an array of integers"));
        assert!(err(r#"{}"#).starts_with("token_ids is missing"));
        assert!(err(r#"[1,2]"#).contains("invalid type"));
        assert!(err(r#"{"token_ids":[1]} x"#).contains("trailing characters"));
        assert!(err("").contains("EOF"));
    }
}
