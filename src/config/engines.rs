//! Engines listed by their address (the config file's `engines` list, or one engine in a
//! `POST /register` body): vLLM, SGLang or xLLM servers that kvdir reaches without etcd. One
//! description gives the OpenAI base URL (forwarding, `/health`, `/metrics`), the event and
//! replay endpoints of every DP rank, the block size, the model and the topic.
//!
//! A single endpoint `tcp://host:port` names rank 0; rank r is `port + r`, as vLLM and SGLang
//! number them. An explicit list names every rank. An engine listed without `events` (and
//! without `replay`) publishes no KV events: it gets no stream and approximate credit from
//! kvdir's own routing (`kvdir::car::ApproxCache`), with `dp_size` ranks.

use serde_json::Value;

use super::bind::{no_bind, BindConfig, TopicVars, BIND_ENDPOINT};
use super::endpoint::check_endpoint;
use super::json::{kind, Fields};
use super::{is_bound, ConfigError, Dialect, StreamSpec};

/// The fields of one engine.
pub const ENGINE_FIELDS: &[&str] =
    &["name", "url", "dialect", "events", "replay", "dp_size", "block_size", "model", "topic"];

/// Most DP ranks one engine may list (the `max_streams` ceiling).
const MAX_DP_SIZE: u64 = super::MAX_STREAMS;

/// Largest block size accepted, as for streams.
const MAX_BLOCK_SIZE: u64 = 65_536;

/// One engine kvdir reaches by its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// The instance name: `name`, or the URL's `host:port`.
    pub name: String,
    /// The base URL, `http://host:port` (no trailing `/` nor `/v1`): the front door posts
    /// `/v1/...` there, and kvdir polls `/health` and `/metrics`.
    pub url: String,
    /// What kind of engine it is: its replay, metrics and process identity.
    pub dialect: Dialect,
    /// The live event endpoint of each DP rank; empty for an engine without KV events.
    pub events: Vec<String>,
    /// The replay endpoint of each DP rank; empty for an engine without KV events.
    pub replay: Vec<String>,
    /// DP ranks.
    pub ranks: u32,
    /// Tokens per block (vLLM `--block-size`, SGLang `--page-size`).
    pub block_size: u32,
    /// The served model name; empty: answers queries for any model.
    pub model: String,
    /// The publisher topic (vLLM's default is `""`).
    pub topic: String,
    /// The UID of the Kubernetes pod it runs in (`kubernetes`); empty for any other engine.
    /// Part of its process identity: a pod recreated under the same name is another engine.
    pub pod_uid: String,
}

impl EngineSpec {
    /// DP ranks.
    pub fn dp_size(&self) -> u32 {
        self.ranks
    }

    /// Whether the engine publishes no KV events (listed without `events`): no stream,
    /// approximate credit.
    pub fn is_approximate(&self) -> bool {
        self.events.is_empty()
    }

    /// Whether the engine publishes to kvdir's bind endpoint (`"events": "bind"`).
    pub fn is_bound(&self) -> bool {
        self.events.first().is_some_and(|e| is_bound(e))
    }

    /// One stream per DP rank, with the dialect's replay.
    pub fn streams(&self) -> Vec<StreamSpec> {
        (0..self.events.len())
            .map(|r| StreamSpec {
                instance_name: self.name.clone(),
                dp_rank: r as u32,
                block_size: self.block_size,
                endpoint: self.events[r].clone(),
                replay_endpoint: self.replay[r].clone(),
                topic: self.topic.clone(),
                hash_seed: 1024,
                model: self.model.clone(),
                salt: String::new(),
                replay: self.dialect.replay(),
            })
            .collect()
    }
}

/// Parses one engine given alone (a `POST /register` body): every problem at once.
pub fn parse_engine_json(value: &Value) -> Result<EngineSpec, ConfigError> {
    parse_engine_json_with(value, None)
}

/// [`parse_engine_json`] where kvdir binds `bind` for engines (`"events": "bind"`).
pub fn parse_engine_json_with(
    value: &Value,
    bind: Option<&BindConfig>,
) -> Result<EngineSpec, ConfigError> {
    let mut errors = Vec::new();
    match parse_engine("engine", value, bind, &mut errors) {
        Some(e) if errors.is_empty() => Ok(e),
        _ => Err(ConfigError::new(errors)),
    }
}

/// Parses the engine at `path`, collecting problems in `errors`.
pub(crate) fn parse_engine(
    path: &str,
    v: &Value,
    bind: Option<&BindConfig>,
    errors: &mut Vec<String>,
) -> Option<EngineSpec> {
    let mut f = Fields::new(path, v, ENGINE_FIELDS, errors)?;
    let url_hint = "give the engine's OpenAI base URL, such as http://127.0.0.1:8100";
    let url = f.required_string("url", url_hint);
    let url = if url.is_empty() { None } else { base_url(&url, path, f.errors) };
    let dialect_text = f.required_string("dialect", "say \"vllm\", \"sglang\" or \"xllm\"");
    let dialect = Dialect::parse(&dialect_text);
    if dialect.is_none() && !dialect_text.is_empty() {
        f.errors.push(format!(
            "{path}.dialect = {dialect_text:?}: expected \"vllm\", \"sglang\" or \"xllm\""
        ));
    }
    let explicit = f.raw("dp_size").is_some();
    let dp_size = f.int("dp_size", 1, 1, MAX_DP_SIZE) as u32;
    let block_size = block_size(&mut f, path);
    let dp = (dp_size, explicit);
    let bound = f.raw("events").is_some_and(|e| e.as_str() == Some("bind"));
    let approximate = f.raw("events").is_none();
    let events = match (bound, approximate) {
        (true, _) => bound_events(&mut f, path, bind, dp),
        (false, true) => Some(Vec::new()),
        (false, false) => endpoints(&mut f, path, "events", dp),
    };
    let replay = match approximate {
        true => no_replay(&mut f, path),
        false => endpoints(&mut f, path, "replay", dp),
    };
    if let (Some(e), Some(r)) = (&events, &replay) {
        if e.len() != r.len() {
            f.errors.push(format!(
                "{path}: events name {} ranks but replay names {}; list as many of each",
                e.len(),
                r.len()
            ));
        }
    }
    let model = f.string("model", "");
    let explicit_topic = f.raw("topic").is_some();
    let mut topic = f.string("topic", "");
    let name = match f.raw("name") {
        Some(_) => f.required_string("name", "name the engine, or leave name out"),
        None => url.as_deref().and_then(|u| u.strip_prefix("http://")).unwrap_or("").to_string(),
    };
    if let (true, false, Some(b), Some(u)) = (bound, explicit_topic, bind, &url) {
        let (host, port) = crate::registry::split_host_port(&u["http://".len()..])?;
        topic = b.topic.render(&TopicVars { host, port, model: &model, name: &name });
    }
    let (url, dialect, events, replay) = (url?, dialect?, events?, replay?);
    let ranks = if approximate { dp_size } else { events.len() as u32 };
    let pod_uid = String::new();
    Some(EngineSpec {
        name,
        url,
        dialect,
        events,
        replay,
        ranks,
        block_size,
        model,
        topic,
        pod_uid,
    })
}

/// An engine without `events` publishes no KV events, so it has no replay endpoint either.
fn no_replay(f: &mut Fields<'_>, path: &str) -> Option<Vec<String>> {
    if f.raw("replay").is_some() {
        f.errors.push(format!(
            "{path}.replay is given without events; give the engine's events endpoint too, or \
             leave both out for an engine without KV events (approximate credit)"
        ));
        return None;
    }
    Some(Vec::new())
}

/// `"events": "bind"`: every rank publishes to the bind endpoint, which must exist and serve
/// `dp_size` (given) ranks.
fn bound_events(
    f: &mut Fields<'_>,
    path: &str,
    bind: Option<&BindConfig>,
    (dp_size, explicit): (u32, bool),
) -> Option<Vec<String>> {
    let Some(bind) = bind else {
        f.errors.push(no_bind(&format!("{path}.events")));
        return None;
    };
    if !explicit {
        f.errors.push(format!(
            "{path}.dp_size: missing; an engine with \"events\": \"bind\" must give its DP size \
             (at most kv_events_bind.ranks = {})",
            bind.ranks
        ));
        return None;
    }
    if dp_size > bind.ranks {
        f.errors.push(format!(
            "{path}.dp_size = {dp_size} exceeds kv_events_bind.ranks = {}; raise ranks (kvdir \
             binds one port per rank)",
            bind.ranks
        ));
        return None;
    }
    Some(vec![BIND_ENDPOINT.to_string(); dp_size as usize])
}

/// `block_size`, required: no default is right for every engine (vLLM's is 16 on GPU, SGLang's
/// page size 1, xLLM's 128).
fn block_size(f: &mut Fields<'_>, path: &str) -> u32 {
    if f.raw("block_size").is_none() {
        f.errors.push(format!(
            "{path}.block_size: missing; give the engine's block size (vLLM --block-size, \
             SGLang --page-size): a wrong one matches no prompt"
        ));
        return 0;
    }
    f.int("block_size", 16, 1, MAX_BLOCK_SIZE) as u32
}

/// `http://host:port`, with a trailing `/` or `/v1` (an OpenAI base URL) taken off.
fn base_url(url: &str, path: &str, errors: &mut Vec<String>) -> Option<String> {
    let bad = |why: &str| format!("{path}.url = {url:?}: {why}");
    let Some(rest) = url.strip_prefix("http://") else {
        errors.push(bad("must start with http:// (kvdir speaks plain HTTP to engines)"));
        return None;
    };
    let rest = rest.trim_end_matches('/');
    let rest = rest.strip_suffix("/v1").unwrap_or(rest);
    match crate::registry::split_host_port(rest) {
        Some(_) if !rest.contains('/') => Some(format!("http://{rest}")),
        _ => {
            errors.push(bad("must be http://host:port (kvdir adds /v1/..., /health, /metrics)"));
            None
        }
    }
}

/// `events` or `replay`: one endpoint for rank 0 (rank r at port + r) or one per rank.
fn endpoints(
    f: &mut Fields<'_>,
    path: &str,
    key: &str,
    (dp_size, explicit): (u32, bool),
) -> Option<Vec<String>> {
    let hint = "give a connectable address such as tcp://127.0.0.1:5557";
    let list: Vec<String> = match f.raw(key) {
        None => {
            f.errors.push(format!("{path}.{key}: missing; {hint}"));
            return None;
        }
        Some(Value::String(s)) => {
            check(f, path, key, s)?;
            return numbered(f, path, key, s, dp_size);
        }
        Some(Value::Array(a)) => listed(f, path, key, a)?,
        Some(v) => {
            let found = kind(v);
            f.errors.push(format!("{path}.{key}: expected a string or a list, found {found}"));
            return None;
        }
    };
    if list.is_empty() || (explicit && list.len() != dp_size as usize) {
        f.errors.push(format!(
            "{path}.{key}: lists {} endpoints but dp_size = {dp_size}; list one per DP rank or \
             give rank 0's endpoint alone",
            list.len()
        ));
        return None;
    }
    Some(list)
}

/// An explicit list of endpoints, each checked.
fn listed(f: &mut Fields<'_>, path: &str, key: &str, a: &[Value]) -> Option<Vec<String>> {
    let mut out = Vec::with_capacity(a.len());
    for (i, v) in a.iter().enumerate() {
        let Some(s) = v.as_str() else {
            f.errors.push(format!("{path}.{key}[{i}]: expected a string, found {}", kind(v)));
            return None;
        };
        check(f, &format!("{path}.{key}[{i}]"), "", s)?;
        out.push(s.to_string());
    }
    Some(out)
}

fn check(f: &mut Fields<'_>, path: &str, key: &str, ep: &str) -> Option<()> {
    let at = if key.is_empty() { path.to_string() } else { format!("{path}.{key}") };
    check_endpoint(ep).map_err(|e| f.errors.push(format!("{at} = {ep:?}: {e}"))).ok()
}

/// Rank r of `tcp://host:port` at `port + r`.
fn numbered(
    f: &mut Fields<'_>,
    path: &str,
    key: &str,
    ep: &str,
    dp_size: u32,
) -> Option<Vec<String>> {
    let (host, port) = ep.rsplit_once(':')?;
    let port: u64 = port.parse().ok()?;
    let last = port + u64::from(dp_size) - 1;
    if last > 65_535 {
        f.errors.push(format!(
            "{path}.{key} = {ep:?}: rank {} would be at port {last} > 65535; list the ranks' \
             endpoints",
            dp_size - 1
        ));
        return None;
    }
    Some((0..u64::from(dp_size)).map(|r| format!("{host}:{}", port + r)).collect())
}
