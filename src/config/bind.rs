//! `kv_events_bind`: an endpoint engines connect to. kvdir binds one SUB socket per DP rank
//! (`port + r` carries rank r, as vLLM offsets a publisher's port by its rank) and tells engines
//! apart by the topic of each message, named by a pattern such as llm-d's `kv@{host}@{model}`.
//!
//! A stream fed from the bind endpoint is an ordinary stream whose live endpoint is
//! [`BIND_ENDPOINT`] (the in-process socket the bind receiver re-publishes on) and whose topic
//! is the engine's; the stream set gives it a fixed-width key ([`keyed_topic`]) when it starts.

use serde_json::Value;

use super::json::Fields;

/// The in-process endpoint bound streams subscribe to.
pub const BIND_ENDPOINT: &str = "inproc://kvdir-bind";

/// Width of a bound stream's key: 16 hex digits of its id.
pub const KEY_WIDTH: usize = 16;

/// Most ranks one bind endpoint serves.
pub const MAX_BIND_RANKS: u64 = 1024;

/// The default topic pattern (llm-d's convention).
pub const DEFAULT_TOPIC_PATTERN: &str = "kv@{host}@{model}";

const FIELDS: &[&str] = &["endpoint", "ranks", "topic", "announce"];
const PLACEHOLDERS: &[&str] = &["host", "port", "model", "name"];

/// Whether a stream's live endpoint is the bind endpoint.
pub fn is_bound(endpoint: &str) -> bool {
    endpoint == BIND_ENDPOINT
}

/// The topic a bound stream subscribes to on [`BIND_ENDPOINT`]: its key, 16 hex digits, then
/// the engine's topic. Subscriptions match by prefix; the fixed-width key makes them
/// prefix-free, so no stream receives another's messages.
pub fn keyed_topic(key: u64, topic: &str) -> String {
    format!("{key:016x}{topic}")
}

/// The validated `kv_events_bind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindConfig {
    /// Where rank 0's SUB socket binds, `tcp://HOST:PORT` (`*` for every interface).
    pub endpoint: String,
    /// Ranks served: ports `PORT..PORT + ranks`.
    pub ranks: u32,
    /// How an engine's topic is named.
    pub topic: TopicPattern,
    /// Engines that announce themselves by their topic, if allowed (`announce.rs`).
    pub announce: Option<super::announce::AnnounceConfig>,
}

impl BindConfig {
    /// A bind endpoint with the default ranks (1) and topic pattern; `Err` names the problem.
    pub fn with_endpoint(endpoint: &str) -> Result<Self, String> {
        let topic = TopicPattern::parse(DEFAULT_TOPIC_PATTERN)?;
        let c = BindConfig { endpoint: endpoint.to_string(), ranks: 1, topic, announce: None };
        check_bind_endpoint(endpoint, 1)?;
        Ok(c)
    }

    /// The bound endpoint of each rank (`port + r`).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.ranks).map(|r| self.rank_endpoint(r)).collect()
    }

    /// Rank `r`'s bound endpoint.
    pub fn rank_endpoint(&self, r: u32) -> String {
        let (host, port) = self.endpoint.rsplit_once(':').unwrap_or((&self.endpoint, "0"));
        let port: u32 = port.parse().unwrap_or(0);
        format!("{host}:{}", port + r)
    }
}

/// A bind endpoint: `tcp://HOST:PORT` with a host (`*`, an address or an interface) and ports
/// `PORT..PORT + ranks` in 1..=65535.
pub fn check_bind_endpoint(ep: &str, ranks: u32) -> Result<(), String> {
    let hint = "use tcp://HOST:PORT, such as tcp://*:5557";
    let Some(rest) = ep.strip_prefix("tcp://") else {
        return Err(format!("must start with tcp:// ({hint})"));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!("has no port ({hint})"));
    };
    if host.is_empty() || host.contains('/') {
        return Err(format!("host {host:?} is not an address, an interface or * ({hint})"));
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => u64::from(p),
        _ => return Err(format!("port {port:?} is not in 1..=65535 (engines must know it)")),
    };
    let last = port + u64::from(ranks.max(1)) - 1;
    if last > 65_535 {
        return Err(format!(
            "rank {} would bind port {last} > 65535; use a lower port or fewer ranks",
            ranks - 1
        ));
    }
    Ok(())
}

/// A topic pattern: text with the placeholders `{host}`, `{port}`, `{model}` and `{name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPattern(String);

/// What a topic pattern is filled with for one engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct TopicVars<'a> {
    /// The engine's host (from its URL, or a discovered instance's `host:port` name).
    pub host: &'a str,
    /// The engine's port, likewise.
    pub port: u16,
    /// The served model.
    pub model: &'a str,
    /// The instance name.
    pub name: &'a str,
}

impl TopicPattern {
    /// Parses a pattern; `Err` names an unknown placeholder or an unmatched brace.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            if rest[i..].starts_with('}') {
                return Err("has a '}' without '{'; placeholders look like {host}".into());
            }
            let Some(end) = rest[i..].find('}') else {
                return Err("has a '{' without '}'; placeholders look like {host}".into());
            };
            let name = &rest[i + 1..i + end];
            if !PLACEHOLDERS.contains(&name) {
                return Err(format!(
                    "unknown placeholder {{{name}}}; use {{host}}, {{port}}, {{model}} or {{name}}"
                ));
            }
            rest = &rest[i + end + 1..];
        }
        Ok(TopicPattern(text.to_string()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The topic of one engine.
    pub fn render(&self, v: &TopicVars<'_>) -> String {
        let port = v.port.to_string();
        self.0
            .replace("{host}", v.host)
            .replace("{port}", &port)
            .replace("{model}", v.model)
            .replace("{name}", v.name)
    }
}

/// Parses `kv_events_bind`; `endpoint` (the `--kv_events_bind` flag) overrides the file's.
pub(crate) fn parse_bind(
    v: &Value,
    endpoint: Option<&str>,
    errors: &mut Vec<String>,
) -> Option<BindConfig> {
    let mut f = Fields::new("kv_events_bind", v, FIELDS, errors)?;
    let hint = "give the endpoint kvdir binds for engines, such as tcp://*:5557";
    let file_endpoint = match endpoint {
        Some(_) => f.string("endpoint", ""),
        None => f.required_string("endpoint", hint),
    };
    let ranks = f.int("ranks", 1, 1, MAX_BIND_RANKS) as u32;
    let text = f.string("topic", DEFAULT_TOPIC_PATTERN);
    let topic = TopicPattern::parse(&text)
        .map_err(|e| f.errors.push(format!("kv_events_bind.topic = {text:?}: {e}")))
        .ok();
    let endpoint = endpoint.map_or(file_endpoint, str::to_string);
    if !endpoint.is_empty() {
        if let Err(e) = check_bind_endpoint(&endpoint, ranks) {
            f.errors.push(format!("kv_events_bind.endpoint = {endpoint:?}: {e}"));
        }
    }
    let announce = f.raw("announce").and_then(|a| super::announce::parse_announce(a, f.errors));
    Some(BindConfig { endpoint, ranks, topic: topic?, announce })
}

/// The problem with `"events": "bind"` at `path` when kvdir binds nothing.
pub(crate) fn no_bind(path: &str) -> String {
    format!(
        "{path} = \"bind\": kvdir binds no endpoint for engines; add \"kv_events_bind\": \
         {{\"endpoint\": \"tcp://*:5557\"}} to the config file or start kvdir with \
         --kv_events_bind=tcp://*:5557"
    )
}

/// `discovery.events`: `"bind"` gives discovered instances the bind endpoint and its topic
/// pattern; absent, kvdir connects to each instance.
pub(crate) fn discovery_bind(f: &mut Fields<'_>, bind: Option<&BindConfig>) -> Option<BindConfig> {
    match f.string("events", "").as_str() {
        // No events: approximate credit (`DiscoveryConfig::approximate`).
        "" | "none" => None,
        "bind" if f.raw("topic").is_some() => {
            f.errors.push(
                "discovery.topic: with \"events\": \"bind\" each instance's topic comes from \
                 kv_events_bind.topic; leave discovery.topic out"
                    .into(),
            );
            None
        }
        "bind" if bind.is_none() => {
            f.errors.push(no_bind("discovery.events"));
            None
        }
        "bind" => bind.cloned(),
        other => {
            f.errors.push(format!(
                "discovery.events = {other:?}: expected \"bind\" (instances publish to \
                 kv_events_bind), \"none\" (instances publish no KV events: approximate \
                 credit), or leave it out (kvdir connects to each instance)"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_render_and_refuse_unknown_placeholders() {
        let p = TopicPattern::parse("kv@{host}@{model}:{port}/{name}").unwrap();
        let v = TopicVars { host: "10.0.0.7", port: 8000, model: "m", name: "pod-a" };
        assert_eq!(p.render(&v), "kv@10.0.0.7@m:8000/pod-a");
        assert_eq!(TopicPattern::parse("").unwrap().render(&v), "");
        let err = TopicPattern::parse("kv@{ip}").unwrap_err();
        assert!(err.contains("unknown placeholder {ip}; use {host}"), "{err}");
        assert!(TopicPattern::parse("kv@{host").unwrap_err().contains("'{' without '}'"));
        assert!(TopicPattern::parse("kv}").unwrap_err().contains("'}' without '{'"));
    }

    #[test]
    fn bind_endpoints_need_tcp_a_host_and_room_for_every_rank() {
        assert_eq!(check_bind_endpoint("tcp://*:5557", 4), Ok(()));
        assert_eq!(check_bind_endpoint("tcp://127.0.0.1:65535", 1), Ok(()));
        assert!(check_bind_endpoint("ipc:///x", 1).unwrap_err().contains("tcp://"));
        assert!(check_bind_endpoint("tcp://*", 1).unwrap_err().contains("no port"));
        assert!(check_bind_endpoint("tcp://*:0", 1).unwrap_err().contains("1..=65535"));
        assert!(check_bind_endpoint("tcp://:5557", 1).unwrap_err().contains("host \"\""));
        let err = check_bind_endpoint("tcp://*:65535", 2).unwrap_err();
        assert!(err.contains("rank 1 would bind port 65536"), "{err}");
    }

    #[test]
    fn rank_endpoints_follow_the_port() {
        let c = BindConfig::with_endpoint("tcp://127.0.0.1:5557").unwrap();
        let c = BindConfig { ranks: 3, ..c };
        assert_eq!(
            c.endpoints(),
            ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5559"]
        );
        assert_eq!(keyed_topic(26, "kv@h@m"), "000000000000001akv@h@m");
        assert!(is_bound(BIND_ENDPOINT) && !is_bound("tcp://h:1"));
    }
}
