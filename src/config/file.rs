//! The `kv_events_config_file` (protocol.md section 4): `discovery` or a non-empty `streams`
//! list, never both, and/or an `engines` list, plus resource limits. Unknown fields are
//! rejected and every error is reported at once.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::car::ApproxSettings;

use super::bind::{discovery_bind, parse_bind, BindConfig};
use super::endpoint::{canonical_endpoint, check_endpoint};
use super::engines::parse_engine;
use super::json::{kind, Fields};
use super::kubernetes::parse_kubernetes;
use super::{
    ConfigError, ConfigFile, DiscoveryConfig, EngineSpec, Limits, ReplayKind, Source, StreamSpec,
    MAX_STREAMS,
};

const TOP: &[&str] = &[
    "kv_events_bind",
    "discovery",
    "streams",
    "engines",
    "kubernetes",
    "engine_poll_interval_ms",
    "max_streams",
    "max_blocks_per_stream",
    "max_message_bytes",
    "max_buffered_bytes",
    "replay_timeout_ms",
    "resync_interval_ms",
    "publisher_timeout_ms",
    "io_threads",
    "max_concurrent_replays",
    "approximate_ttl_ms",
    "approximate_blocks_per_engine",
];
const DISCOVERY: &[&str] = &[
    "enabled",
    "block_size",
    "topic",
    "event_port_offset",
    "replay_port_offset",
    "refresh_interval_ms",
    "events",
];
const STREAM: &[&str] = &[
    "instance_name",
    "dp_rank",
    "block_size",
    "endpoint",
    "replay_endpoint",
    "topic",
    "hash_seed",
    "model",
    "replay",
];

/// Most blocks credited to one engine without KV events (about 2 GB of entries).
const MAX_APPROXIMATE_BLOCKS: u64 = 1 << 24;

/// Largest block size accepted; engines use 16..=512.
const MAX_BLOCK_SIZE: u64 = 65_536;

/// Parses and validates the JSON text of a config file.
pub fn parse_config_file(text: &str) -> Result<ConfigFile, ConfigError> {
    parse_config_file_with_bind(text, None)
}

/// [`parse_config_file`] with `--kv_events_bind`: it overrides `kv_events_bind.endpoint`, or
/// alone binds that endpoint with the default ranks and topic pattern.
pub fn parse_config_file_with_bind(
    text: &str,
    bind_endpoint: Option<&str>,
) -> Result<ConfigFile, ConfigError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ConfigError::new(vec![format!("config is not valid JSON: {e}")]))?;
    let mut errors = Vec::new();
    let config = parse_value(&value, bind_endpoint, &mut errors);
    match config {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(ConfigError::new(errors)),
    }
}

fn parse_value(
    value: &Value,
    bind_endpoint: Option<&str>,
    errors: &mut Vec<String>,
) -> Option<ConfigFile> {
    let mut top = Fields::new("", value, TOP, errors)?;
    let limits = parse_limits(&mut top);
    let bind = match (top.raw("kv_events_bind"), bind_endpoint) {
        (Some(b), flag) => parse_bind(b, flag, top.errors),
        (None, Some(flag)) => match BindConfig::with_endpoint(flag) {
            Ok(b) => Some(b),
            Err(e) => {
                top.errors.push(format!("--kv_events_bind={flag:?}: {e}"));
                None
            }
        },
        (None, None) => None,
    };
    let poll = Duration::from_millis(top.int("engine_poll_interval_ms", 1000, 100, 60_000));
    let discovery = top.raw("discovery");
    let streams = top.raw("streams");
    let engines = top.raw("engines");
    let pods = top.raw("kubernetes");
    let errors = top.errors;
    let kubernetes = pods.and_then(|k| parse_kubernetes(k, errors));
    let has_engines = engines.is_some();
    let listed = engines.map_or_else(Vec::new, |e| parse_engines(e, bind.as_ref(), errors));
    let has_streams = matches!(streams, Some(Value::Array(a)) if !a.is_empty());
    let source = match (discovery, streams) {
        (Some(_), Some(_)) if has_streams => {
            errors.push(
                "discovery and a non-empty streams list are mutually exclusive; keep one".into(),
            );
            return None;
        }
        (Some(d), _) => Source::Discovery(parse_discovery(d, bind.as_ref(), errors)?),
        (None, Some(s)) => Source::Streams(parse_streams(s, &limits, errors)),
        // An engines list alone (its own problems, if any, are reported already), engine pods
        // from Kubernetes, or engines that will announce themselves on the bind endpoint.
        (None, None)
            if has_engines
                || pods.is_some()
                || bind.as_ref().is_some_and(|b| b.announce.is_some()) =>
        {
            Source::EnginesOnly
        }
        (None, None) => {
            errors.push(
                "config needs \"discovery\", a non-empty \"streams\" list, an \"engines\" list, \
                 \"kubernetes\" or kv_events_bind.announce"
                    .into(),
            );
            return None;
        }
    };
    let statics: &[StreamSpec] = match &source {
        Source::Streams(s) => s,
        _ => &[],
    };
    check_engines_against_streams(&listed, statics, &limits, errors);
    let engines = listed.into_iter().map(|(_, e)| e).collect();
    Some(ConfigFile { source, engines, engine_poll_interval: poll, limits, bind, kubernetes })
}

/// The engines that parse, each with its index in the list.
fn parse_engines(
    v: &Value,
    bind: Option<&BindConfig>,
    errors: &mut Vec<String>,
) -> Vec<(usize, EngineSpec)> {
    let Some(list) = v.as_array() else {
        errors.push(format!("engines: expected an array, found {}", kind(v)));
        return Vec::new();
    };
    if list.is_empty() {
        errors.push("engines: the list is empty; list at least one engine or leave it out".into());
    }
    let engines: Vec<(usize, EngineSpec)> = list
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, parse_engine(&format!("engines[{i}]"), e, bind, errors)?)))
        .collect();
    let mut names = HashMap::new();
    for (i, e) in &engines {
        let i = *i;
        if let Some(j) = first(&mut names, e.name.clone(), i) {
            errors.push(format!(
                "engines[{i}]: name {:?} duplicates engines[{j}]; give each engine its own name",
                e.name
            ));
        }
    }
    engines
}

/// Engines' streams next to each other and to the static `streams`: names must differ,
/// no endpoint may be used twice, and all of them must fit `max_streams`.
fn check_engines_against_streams(
    engines: &[(usize, EngineSpec)],
    streams: &[StreamSpec],
    limits: &Limits,
    errors: &mut Vec<String>,
) {
    if engines.is_empty() {
        return;
    }
    let mut owners: HashMap<String, String> = HashMap::new();
    let mut claim = |ep: &str, who: String, errors: &mut Vec<String>| {
        if let Some(other) = first_owner(&mut owners, same_socket(ep), who.clone()) {
            errors.push(format!("{who} {ep:?} is also {other}; each endpoint serves one stream"));
        }
    };
    for (i, s) in streams.iter().enumerate() {
        claim(&s.endpoint, format!("streams[{i}].endpoint"), errors);
        claim(&s.replay_endpoint, format!("streams[{i}].replay_endpoint"), errors);
        if let Some((j, _)) = engines.iter().find(|(_, e)| e.name == s.instance_name) {
            errors.push(format!(
                "streams[{i}].instance_name {:?} is the name of engines[{j}]; rename one",
                s.instance_name
            ));
        }
    }
    let mut topics = HashMap::new();
    for (i, e) in engines {
        if e.is_bound() {
            if let Some(j) = first(&mut topics, e.topic.clone(), *i) {
                errors.push(format!(
                    "engines[{i}]: topic {:?} is also engines[{j}]'s on the bind endpoint; give \
                     each engine its own topic (set topic, or use {{host}} and {{port}} in \
                     kv_events_bind.topic)",
                    e.topic
                ));
            }
        }
        for (rank, ep) in e.events.iter().enumerate().filter(|_| !e.is_bound()) {
            claim(ep, format!("engines[{i}].events (rank {rank})"), errors);
        }
        for (rank, ep) in e.replay.iter().enumerate() {
            claim(ep, format!("engines[{i}].replay (rank {rank})"), errors);
        }
    }
    let total = streams.len() + engines.iter().map(|(_, e)| e.events.len()).sum::<usize>();
    if total > limits.max_streams {
        errors.push(format!(
            "the engines (and static streams) need {total} streams, more than max_streams = {}; raise \
             max_streams (at most 65536)",
            limits.max_streams
        ));
    }
}

/// Records `who` as the owner of `key`; returns the earlier owner when there was one.
fn first_owner(owners: &mut HashMap<String, String>, key: String, who: String) -> Option<String> {
    match owners.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => Some(e.get().clone()),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(who);
            None
        }
    }
}

fn parse_limits(f: &mut Fields<'_>) -> Limits {
    let d = Limits::default();
    let ms = |v: u64| Duration::from_millis(v);
    Limits {
        max_streams: f.int("max_streams", d.max_streams as u64, 1, MAX_STREAMS) as usize,
        max_blocks_per_stream: f.int(
            "max_blocks_per_stream",
            d.max_blocks_per_stream as u64,
            1,
            u64::from(u32::MAX),
        ) as usize,
        max_message_bytes: f.int("max_message_bytes", d.max_message_bytes as u64, 1, 1 << 32)
            as usize,
        max_buffered_bytes: f.int("max_buffered_bytes", d.max_buffered_bytes as u64, 1, 1 << 36)
            as usize,
        replay_timeout: ms(f.int("replay_timeout_ms", 2000, 1, 3_600_000)),
        resync_interval: ms(f.int("resync_interval_ms", 30_000, 1, 86_400_000)),
        publisher_timeout: ms(f.int("publisher_timeout_ms", 3000, 0, 600_000)),
        io_threads: f.int("io_threads", 0, 0, 64) as usize,
        max_concurrent_replays: f.int(
            "max_concurrent_replays",
            d.max_concurrent_replays as u64,
            1,
            MAX_STREAMS,
        ) as usize,
        approximate: ApproxSettings {
            ttl_ms: f.int("approximate_ttl_ms", d.approximate.ttl_ms, 1, 86_400_000),
            blocks_per_engine: f.int(
                "approximate_blocks_per_engine",
                d.approximate.blocks_per_engine as u64,
                1,
                MAX_APPROXIMATE_BLOCKS,
            ) as usize,
        },
    }
}

fn parse_discovery(
    v: &Value,
    bind: Option<&BindConfig>,
    errors: &mut Vec<String>,
) -> Option<DiscoveryConfig> {
    let mut f = Fields::new("discovery", v, DISCOVERY, errors)?;
    let bind = discovery_bind(&mut f, bind);
    let approximate = f.raw("events").and_then(Value::as_str) == Some("none");
    Some(DiscoveryConfig {
        bind,
        approximate,
        enabled: f.boolean("enabled", true),
        block_size: f.int("block_size", 128, 1, MAX_BLOCK_SIZE) as u32,
        topic: f.string("topic", ""),
        event_port_offset: f.int("event_port_offset", 10_000, 0, 65_535) as u16,
        replay_port_offset: f.int("replay_port_offset", 30_000, 0, 65_535) as u16,
        refresh_interval: Duration::from_millis(f.int("refresh_interval_ms", 1000, 50, 60_000)),
    })
}

fn parse_streams(v: &Value, limits: &Limits, errors: &mut Vec<String>) -> Vec<StreamSpec> {
    let Some(list) = v.as_array() else {
        errors.push(format!("streams: expected an array, found {}", kind(v)));
        return Vec::new();
    };
    if list.is_empty() {
        errors.push("streams: the list is empty; add at least one stream or use discovery".into());
    }
    if list.len() > limits.max_streams {
        errors.push(format!(
            "streams: {} streams exceed max_streams = {}; raise max_streams (at most 65536)",
            list.len(),
            limits.max_streams
        ));
    }
    let specs: Vec<StreamSpec> =
        list.iter().enumerate().filter_map(|(i, s)| parse_stream(i, s, errors)).collect();
    check_unique(&specs, errors);
    specs
}

fn parse_stream(i: usize, v: &Value, errors: &mut Vec<String>) -> Option<StreamSpec> {
    let path = format!("streams[{i}]");
    let mut f = Fields::new(&path, v, STREAM, errors)?;
    let hint = "give a connectable address such as tcp://127.0.0.1:18000";
    let spec = StreamSpec {
        instance_name: f.required_string("instance_name", "name the engine instance"),
        dp_rank: f.int("dp_rank", 0, 0, 65_535) as u32,
        block_size: f.int("block_size", 128, 1, MAX_BLOCK_SIZE) as u32,
        endpoint: f.required_string("endpoint", hint),
        replay_endpoint: f.required_string("replay_endpoint", hint),
        topic: f.string("topic", ""),
        hash_seed: f.int("hash_seed", 1024, 0, u64::MAX),
        model: f.string("model", ""),
        salt: String::new(),
        replay: parse_replay(&mut f, &path),
    };
    for (key, ep) in [("endpoint", &spec.endpoint), ("replay_endpoint", &spec.replay_endpoint)] {
        if !ep.is_empty() {
            if let Err(e) = check_endpoint(ep) {
                f.errors.push(format!("{path}.{key} = {ep:?}: {e}"));
            }
        }
    }
    Some(spec)
}

/// `replay`: `snapshot` (xLLM, the default) or `history` (vLLM, SGLang).
fn parse_replay(f: &mut Fields<'_>, path: &str) -> ReplayKind {
    let text = f.string("replay", "snapshot");
    ReplayKind::parse(&text).unwrap_or_else(|| {
        f.errors.push(format!(
            "{path}.replay = {text:?}: expected \"snapshot\" (xLLM) or \"history\" (vLLM, SGLang)"
        ));
        ReplayKind::Snapshot
    })
}

/// The key an endpoint is compared by: its canonical form, or itself when it has none (it is
/// then already reported as invalid).
fn same_socket(ep: &str) -> String {
    canonical_endpoint(ep).unwrap_or_else(|| ep.to_string())
}

/// ` (both are tcp://...)` when `a` and `b` are spelled differently, else nothing.
fn spelled(a: &str, b: &str, canonical: &str) -> String {
    if a == b {
        String::new()
    } else {
        format!(" (both are {canonical})")
    }
}

/// Duplicate instance/DP pairs, and endpoints that are one socket after canonicalization:
/// duplicate event or replay endpoints, and replay endpoints that overlap event endpoints.
fn check_unique(specs: &[StreamSpec], errors: &mut Vec<String>) {
    let mut pairs = HashMap::new();
    let mut events = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        if let Some(j) = first(&mut pairs, (s.instance_name.clone(), s.dp_rank), i) {
            errors.push(format!(
                "streams[{i}]: instance {:?} dp_rank {} duplicates streams[{j}]",
                s.instance_name, s.dp_rank
            ));
        }
        let key = same_socket(&s.endpoint);
        if let Some(j) = first(&mut events, key.clone(), i) {
            let also = spelled(&s.endpoint, &specs[j].endpoint, &key);
            errors.push(format!(
                "streams[{i}].endpoint {:?} duplicates streams[{j}]{also}",
                s.endpoint
            ));
        }
    }
    let mut replays = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        let key = same_socket(&s.replay_endpoint);
        if let Some(j) = first(&mut replays, key.clone(), i) {
            let also = spelled(&s.replay_endpoint, &specs[j].replay_endpoint, &key);
            errors.push(format!(
                "streams[{i}].replay_endpoint {:?} duplicates streams[{j}]{also}",
                s.replay_endpoint
            ));
        }
        if let Some(&j) = events.get(&key) {
            let also = spelled(&s.replay_endpoint, &specs[j].endpoint, &key);
            errors.push(format!(
                "streams[{i}].replay_endpoint {:?} overlaps the event endpoint of streams[{j}]{also}",
                s.replay_endpoint
            ));
        }
    }
}

/// Records the first index of `key`; returns that first index when `key` was seen before.
fn first<K: std::hash::Hash + Eq>(seen: &mut HashMap<K, usize>, key: K, i: usize) -> Option<usize> {
    match seen.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(i);
            None
        }
    }
}
