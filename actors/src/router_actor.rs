//! `RouterActor`: answers cache queries and routing decisions from the streams' published views
//! and the instance snapshot that discovery pushes.
//!
//! Messages: [`RegisterStream`], [`UnregisterStream`], [`QueryCache`], [`SetCandidates`],
//! [`RouteRequest`], [`GetRecentRoutes`].
//! A query's tokens are hashed once per distinct `(block_size, hash_seed)` and each stream's
//! view is walked without locks; the handler does no I/O. Every routing decision is also kept in
//! a bounded ring ([`RecentRoutes`], the last 20, token counts only) for the status page.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use kvdir::car::{
    route, Candidate, DpHit, RecentRoutes, RecentRoutesReport, Rotation, RouteError, RouteParams,
    Routed,
};
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

/// One instance for routing, with its current identity.
#[derive(Debug, Clone)]
pub struct InstanceInfo {
    /// Everything routing needs except the request's hits.
    pub candidate: Candidate,
    /// The process registered now.
    pub identity: Identity,
}

/// Replace the instance snapshot (from discovery).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetCandidates(pub Vec<InstanceInfo>);

/// Choose instances for a tokenized request.
#[derive(Message)]
#[rtype(result = "Result<Routed, RouteError>")]
pub struct RouteRequest {
    /// The tokenized prompt.
    pub tokens: Vec<i32>,
}

/// The latest routing decisions, newest first.
#[derive(Message)]
#[rtype(result = "RecentRoutesReport")]
pub struct GetRecentRoutes;

/// The query and routing side of the directory.
#[derive(Default)]
pub struct RouterActor {
    streams: BTreeMap<StreamKey, (ViewHandle, Option<Identity>)>,
    hashers: HashMap<(u32, u64), KeyHasher>,
    instances: Vec<InstanceInfo>,
    params: RouteParams,
    rotation: Rotation,
    recent: RecentRoutes,
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

impl Handler<SetCandidates> for RouterActor {
    type Result = ();

    fn handle(&mut self, msg: SetCandidates, _: &mut Context<Self>) {
        self.instances = msg.0;
    }
}

impl Handler<RouteRequest> for RouterActor {
    type Result = Result<Routed, RouteError>;

    fn handle(&mut self, msg: RouteRequest, _: &mut Context<Self>) -> Self::Result {
        let cands = self.candidates(&msg.tokens);
        let routed = route(&cands, msg.tokens.len(), &self.params, &mut self.rotation);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.recent.record(now, msg.tokens.len(), &routed);
        routed
    }
}

impl Handler<GetRecentRoutes> for RouterActor {
    type Result = MessageResult<GetRecentRoutes>;

    fn handle(&mut self, _: GetRecentRoutes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.recent.report())
    }
}

impl RouterActor {
    /// A router deciding with `params`.
    pub fn new(params: RouteParams) -> Self {
        RouterActor { params, ..RouterActor::default() }
    }

    /// The instance snapshot with each instance's per-DP hits for `tokens`.
    fn candidates(&mut self, tokens: &[i32]) -> Vec<Candidate> {
        let answer = self.query(tokens);
        let mut by_instance: HashMap<&str, Vec<&StreamMatch>> = HashMap::new();
        for m in &answer.matches {
            by_instance.entry(m.instance_name.as_str()).or_default().push(m);
        }
        self.instances
            .iter()
            .map(|info| {
                let mut c = info.candidate.clone();
                let matches = by_instance.get(c.name.as_str()).map_or(&[][..], Vec::as_slice);
                c.hits = matches
                    .iter()
                    .map(|m| DpHit {
                        dp_rank: m.dp_rank,
                        synchronized: m.synchronized,
                        identity_matches: self.identity_matches(&c.name, m.dp_rank, &info.identity),
                        device_hit_tokens: m.device_hit_tokens,
                        host_only_hit_tokens: m.host_only_hit_tokens,
                    })
                    .collect();
                c
            })
            .collect()
    }

    /// Whether the stream was started for the instance's current process. Streams without an
    /// identity (static configuration) give no CAR credit.
    fn identity_matches(&self, name: &str, dp_rank: u32, current: &Identity) -> bool {
        let key = StreamKey { instance_name: name.to_string(), dp_rank };
        matches!(self.streams.get(&key), Some((_, Some(id))) if id.same_process(current))
    }

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
