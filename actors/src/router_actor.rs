//! `RouterActor`: answers cache queries from the streams' published views.
//!
//! Messages: [`RegisterStream`], [`UnregisterStream`], [`QueryCache`].
//! A query's tokens are hashed once per distinct `(block_size, hash_seed)` and each stream's
//! view is walked without locks; the handler does no I/O.

use std::collections::{BTreeMap, HashMap};

use actix::prelude::*;
use kvdir::index::{ContentKey, IndexReader, KeyHasher, ViewHandle};
use kvdir::query::{QueryResponse, StreamMatch};
use kvdir::registry::Identity;

/// A stream's identity: instance and DP rank.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamKey {
    /// Instance name.
    pub instance_name: String,
    /// DP rank.
    pub dp_rank: u32,
}

/// Start answering for a stream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RegisterStream {
    /// Its identity.
    pub key: StreamKey,
    /// Its view.
    pub reader: IndexReader,
    /// The engine process it was started for (discovery only).
    pub identity: Option<Identity>,
}

/// Stop answering for a stream (its entries leave the query response).
#[derive(Message)]
#[rtype(result = "()")]
pub struct UnregisterStream {
    /// Its identity.
    pub key: StreamKey,
}

/// How much of `tokens` each stream holds.
#[derive(Message)]
#[rtype(result = "QueryResponse")]
pub struct QueryCache {
    /// The tokenized prompt.
    pub tokens: Vec<i32>,
}

/// The query side of the directory.
#[derive(Default)]
pub struct RouterActor {
    streams: BTreeMap<StreamKey, (ViewHandle, Option<Identity>)>,
    hashers: HashMap<(u32, u64), KeyHasher>,
}

impl Actor for RouterActor {
    type Context = Context<Self>;
}

impl Handler<RegisterStream> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: RegisterStream, _: &mut Context<Self>) {
        self.streams.insert(msg.key, (msg.reader.handle(), msg.identity));
    }
}

impl Handler<UnregisterStream> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: UnregisterStream, _: &mut Context<Self>) {
        self.streams.remove(&msg.key);
    }
}

impl Handler<QueryCache> for RouterActor {
    type Result = MessageResult<QueryCache>;

    fn handle(&mut self, msg: QueryCache, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.query(&msg.tokens))
    }
}

impl RouterActor {
    /// Matches `tokens` against every stream.
    pub fn query(&mut self, tokens: &[i32]) -> QueryResponse {
        let mut keys: HashMap<(u32, u64), Vec<ContentKey>> = HashMap::new();
        let mut matches = Vec::with_capacity(self.streams.len());
        for (key, (view, _)) in &self.streams {
            let group = (view.block_size(), view.hash_seed());
            let qkeys = keys.entry(group).or_insert_with(|| {
                let hasher =
                    self.hashers.entry(group).or_insert_with(|| KeyHasher::new(group.0, group.1));
                let mut out = Vec::with_capacity(tokens.len() / group.0.max(1) as usize);
                hasher.prefix_keys(tokens, &mut out);
                out
            });
            let m = view.match_prefix(qkeys);
            matches.push(StreamMatch {
                instance_name: key.instance_name.clone(),
                dp_rank: key.dp_rank,
                synchronized: m.status.synchronized,
                sequence: m.status.sequence,
                device_hit_tokens: m.device_hit_tokens,
                host_only_hit_tokens: m.host_only_hit_tokens,
                reusable_prefix_tokens: m.reusable_prefix_tokens(),
                device_blocks: m.status.device_blocks,
                host_blocks: m.status.host_blocks,
                error: m.status.error.clone(),
            });
        }
        QueryResponse { input_tokens: tokens.len(), matches }
    }
}
