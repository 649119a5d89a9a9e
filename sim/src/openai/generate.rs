//! Serving one admitted request: which DP rank gets it (the xLLM dialect: [`choose_rank`], the
//! longest cached prefix; the vLLM dialect: the rank the request's `X-data-parallel-rank`
//! names, else vLLM's cache-blind balancer, [`balance_rank`]), and the tokens it produces, as
//! one JSON answer or as a stream of SSE chunks that stops when the client goes away.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::web::Bytes;
use futures_util::stream::{self, Stream};
use kvdir_text::TextModel;
use serde_json::{json, Value};

use super::request::{Kind, Params};
use super::{RequestGuard, RequestLoad};
use crate::engine::Ranks;
use crate::SimError;

/// What the engine "generates": this text, tokenized by the served model, cycled.
pub(crate) const ANSWER_TEXT: &str = "The simulated engine answers every request with these \
     same words, one token at a time, so that clients can watch a stream arrive. ";

/// The text of each answer token, in order (each token decoded alone).
pub(crate) fn answer_pieces(model: &TextModel) -> Vec<String> {
    let ids = model.encode(ANSWER_TEXT, false).unwrap_or_default();
    let pieces: Vec<String> =
        ids.iter().map(|id| model.decode(&[*id]).unwrap_or_default()).collect();
    if pieces.is_empty() {
        vec![ANSWER_TEXT.to_string()]
    } else {
        pieces
    }
}

/// The rank rule: the rank with the longest cached prefix of `tokens` (Device or Host blocks),
/// ties to the rank with the fewest requests in flight, then to the lowest rank. Returns the
/// rank and its cached prefix in tokens.
pub(crate) fn choose_rank(
    ranks: &Ranks,
    load: &RequestLoad,
    tokens: &[i32],
    salt: Option<&str>,
) -> Result<(u32, u64), SimError> {
    let tokens = Arc::new(tokens.to_vec());
    let salt: Option<Arc<str>> = salt.map(Arc::from);
    let mut best: Option<(u64, u64, u32)> = None;
    for rank in 0..ranks.dp_size() {
        let (prompt, salt) = (Arc::clone(&tokens), salt.clone());
        let (device, host) = ranks.call(rank, move |r| Ok(r.resident(&prompt, salt.as_deref())))?;
        let (cached, busy) = (device + host, load.on_rank(rank));
        let better = best.is_none_or(|(c, b, _)| cached > c || (cached == c && busy < b));
        if better {
            best = Some((cached, busy, rank));
        }
    }
    Ok(best.map_or((0, 0), |(cached, _, rank)| (rank, cached)))
}

/// The request header vLLM (and SGLang) take a DP rank from (`X-data-parallel-rank`; header
/// names are case-insensitive).
pub const RANK_HEADER: &str = "x-data-parallel-rank";

/// vLLM's own balancer (`DPLBAsyncMPClient`, used when a request names no rank): the rank with
/// the fewest requests in flight, scanning from a start that moves on every call, so idle
/// ranks take requests in turn. It does not look at the cache.
pub(crate) fn balance_rank(load: &RequestLoad, dp_size: u32, start: u64) -> u32 {
    let dp = u64::from(dp_size.max(1));
    (0..dp).map(|i| ((start + i) % dp) as u32).min_by_key(|&rank| load.on_rank(rank)).unwrap_or(0)
}

/// The cached prefix of `tokens` on `rank`, in tokens (Device or Host blocks).
pub(crate) fn cached_on(
    ranks: &Ranks,
    rank: u32,
    tokens: &[i32],
    salt: Option<&str>,
) -> Result<u64, SimError> {
    let (prompt, salt) = (tokens.to_vec(), salt.map(str::to_string));
    let (device, host) = ranks.call(rank, move |r| Ok(r.resident(&prompt, salt.as_deref())))?;
    Ok(device + host)
}

/// Everything needed to answer one request once its prefill is done.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) kind: Kind,
    pub(crate) params: Params,
    pub(crate) model: String,
    pub(crate) prompt_tokens: u64,
    /// What the answer reports (`None`: no details).
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) decode: Duration,
    pub(crate) pieces: Arc<Vec<String>>,
    id: String,
    created: u64,
}

impl Reply {
    pub(crate) fn new(
        kind: Kind,
        params: Params,
        model: &str,
        prompt_tokens: u64,
        cached_tokens: Option<u64>,
        decode: Duration,
        pieces: Arc<Vec<String>>,
    ) -> Reply {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let id = match kind {
            Kind::Chat => format!("chatcmpl-sim-{n}"),
            Kind::Completion => format!("cmpl-sim-{n}"),
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let model = model.to_string();
        Reply { kind, params, model, prompt_tokens, cached_tokens, decode, pieces, id, created }
    }

    fn piece(&self, i: usize) -> &str {
        &self.pieces[i % self.pieces.len()]
    }

    fn usage(&self) -> Value {
        let completion = u64::from(self.params.max_tokens);
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": self.cached_tokens.map(|c| json!({ "cached_tokens": c })),
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The whole answer, after sleeping the decode cost of every token.
    pub(crate) async fn complete(&self) -> Value {
        let n = self.params.max_tokens;
        tokio::time::sleep(self.decode.saturating_mul(n)).await;
        let text: String = (0..n as usize).map(|i| self.piece(i)).collect();
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": "length",
            }),
            Kind::Completion => {
                json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": "length" })
            }
        };
        let mut body = self.envelope(false, json!([choice]));
        body["usage"] = self.usage();
        body
    }

    /// The chunk carrying output token `i` (the last one carries `finish_reason`).
    fn token_chunk(&self, i: usize) -> Value {
        let last = i + 1 == self.params.max_tokens as usize;
        let finish = if last { json!("length") } else { Value::Null };
        let choice = match self.kind {
            Kind::Chat if i == 0 => json!({
                "index": 0,
                "delta": { "role": "assistant", "content": self.piece(i) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            Kind::Chat => json!({
                "index": 0,
                "delta": { "content": self.piece(i) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            Kind::Completion => {
                json!({ "index": 0, "text": self.piece(i), "logprobs": null, "finish_reason": finish })
            }
        };
        self.envelope(true, json!([choice]))
    }

    /// SSE event number `step`: tokens `0..max_tokens`, then the usage chunk (when asked for),
    /// then `[DONE]`; `None` after that.
    async fn event(&self, step: usize) -> Option<String> {
        let n = self.params.max_tokens as usize;
        let data = if step < n {
            tokio::time::sleep(self.decode).await;
            self.token_chunk(step).to_string()
        } else if step == n && self.params.include_usage {
            let mut chunk = self.envelope(true, json!([]));
            chunk["usage"] = self.usage();
            chunk.to_string()
        } else if step == n || step == n + 1 {
            "[DONE]".to_string()
        } else {
            return None;
        };
        Some(format!("data: {data}\n\n"))
    }
}

/// The SSE body of a streaming request. Each token is produced when the body is polled for it,
/// so a dropped body (the client went away) produces nothing more, and dropping `guard` with
/// it takes the request out of the load counts.
pub(crate) fn sse(
    reply: Reply,
    guard: RequestGuard,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    stream::unfold((reply, guard, 0usize, false), |(reply, guard, step, done)| async move {
        if done {
            return None;
        }
        let event = reply.event(step).await?;
        let done = event == "data: [DONE]\n\n";
        Some((Ok(Bytes::from(event)), (reply, guard, step + 1, done)))
    })
}
