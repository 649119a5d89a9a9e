//! Engines that announce themselves (`kv_events_bind.announce`): an engine that publishes to
//! kvdir's bound endpoint under a topic of llm-d's form `kv@<ip>:<port>@<model>` that no
//! listed engine owns is taken as a new engine, at `http://<ip>:<port>`, with its replay
//! endpoint at `replay_port` on the same host, when `<ip>` is in the allow list.
//!
//! Off unless configured, with an allow list that must not be empty: anyone who can reach the
//! bound port could otherwise point routes anywhere.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use super::json::Fields;
use super::Dialect;

const FIELDS: &[&str] = &["allow", "replay_port", "dialect", "block_size", "drop_after_ms"];

/// An address block, `10.0.0.0/8` or `fd00::/8` (a bare address is its own block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::y/n` or a bare address; `Err` says what is wrong.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
        let net: IpAddr = addr.parse().map_err(|_| format!("{addr:?} is no IP address"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            "" => max,
            p => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or(format!("prefix /{p} is not in 0..={max}"))?,
        };
        Ok(Cidr { net, prefix })
    }

    /// Whether `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |a: IpAddr| match a {
            IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32),
            IpAddr::V6(v) => (u128::from(v), 128),
        };
        let ((net, n), (ip, m)) = (bits(self.net), bits(ip));
        if n != m {
            return false;
        }
        let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
        net & mask == ip & mask
    }
}

/// `kv_events_bind.announce`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceConfig {
    /// The addresses an announced engine may have.
    pub allow: Vec<Cidr>,
    /// The engines' replay port (vLLM's `replay_endpoint`), on the announced host.
    pub replay_port: u16,
    /// Their dialect (default `vllm`, whose topics llm-d names so).
    pub dialect: Dialect,
    /// Their block size.
    pub block_size: u32,
    /// How long an announced engine that fails its polls is kept before it is dropped.
    pub drop_after: Duration,
}

impl AnnounceConfig {
    /// The engine a topic announces, if it has llm-d's form and an allowed address.
    pub fn engine(&self, topic: &str) -> Option<Announced> {
        let a = parse_topic(topic)?;
        self.allow.iter().any(|c| c.contains(a.ip)).then_some(a)
    }
}

/// An engine named by its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// Its address.
    pub ip: IpAddr,
    /// Its HTTP port.
    pub port: u16,
    /// The model it serves.
    pub model: String,
}

impl Announced {
    /// Its name and HTTP address, `ip:port` (`[ip]:port` for IPv6).
    pub fn host(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// `kv@<ip>:<port>@<model>`, llm-d's topic; `None` for any other form.
pub fn parse_topic(topic: &str) -> Option<Announced> {
    let rest = topic.strip_prefix("kv@")?;
    let (host, model) = rest.split_once('@')?;
    let addr: std::net::SocketAddr = host.parse().ok().or_else(|| {
        let (ip, port) = host.rsplit_once(':')?;
        format!("{ip}:{port}").parse().ok()
    })?;
    if model.is_empty() || addr.port() == 0 {
        return None;
    }
    Some(Announced { ip: addr.ip(), port: addr.port(), model: model.to_string() })
}

/// Parses `kv_events_bind.announce`.
pub(crate) fn parse_announce(v: &Value, errors: &mut Vec<String>) -> Option<AnnounceConfig> {
    let mut f = Fields::new("kv_events_bind.announce", v, FIELDS, errors)?;
    let allow: Vec<Cidr> = match f.raw("allow").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list
            .iter()
            .filter_map(|c| {
                let text = c.as_str().unwrap_or_default();
                Cidr::parse(text)
                    .map_err(|e| {
                        f.errors.push(format!("kv_events_bind.announce.allow {text:?}: {e}"))
                    })
                    .ok()
            })
            .collect(),
        _ => {
            f.errors.push(
                "kv_events_bind.announce.allow: missing or empty; list the address blocks engines \
                 may announce from, such as [\"10.0.0.0/8\"] (anyone who reaches the port could \
                 otherwise point routes anywhere)"
                    .into(),
            );
            Vec::new()
        }
    };
    let replay_port = f.int("replay_port", 5557, 1, 65535) as u16;
    let dialect = match f.string("dialect", "vllm").as_str() {
        "vllm" => Dialect::Vllm,
        "sglang" => Dialect::Sglang,
        other => {
            f.errors.push(format!(
                "kv_events_bind.announce.dialect = {other:?}: engines that announce themselves \
                 are \"vllm\" or \"sglang\""
            ));
            Dialect::Vllm
        }
    };
    let block_size = f.int("block_size", 16, 1, 1 << 20) as u32;
    let drop_after = Duration::from_millis(f.int("drop_after_ms", 30_000, 1_000, 3_600_000));
    Some(AnnounceConfig { allow, replay_port, dialect, block_size, drop_after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_d_topics_name_the_engine() {
        let a = parse_topic("kv@10.1.2.3:8000@meta-llama/Llama-3.1-8B").unwrap();
        assert_eq!(
            (a.host(), a.model.as_str()),
            ("10.1.2.3:8000".into(), "meta-llama/Llama-3.1-8B")
        );
        assert_eq!(parse_topic("kv@[fd00::1]:8000@m").unwrap().host(), "[fd00::1]:8000");
        for bad in ["kv", "kv@10.1.2.3@m", "kv@10.1.2.3:8000@", "xx@10.1.2.3:8000@m", "kv@h:1@m"] {
            assert_eq!(parse_topic(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_allowed_addresses_are_taken() {
        let mut errors = Vec::new();
        let v = serde_json::json!({"allow": ["10.0.0.0/8", "127.0.0.1"], "replay_port": 5567});
        let c = parse_announce(&v, &mut errors).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert!(c.engine("kv@10.9.8.7:8000@m").is_some());
        assert!(c.engine("kv@127.0.0.1:8000@m").is_some());
        assert!(c.engine("kv@127.0.0.2:8000@m").is_none());
        assert!(c.engine("kv@192.168.0.1:8000@m").is_none());
        assert_eq!((c.replay_port, c.block_size, c.dialect), (5567, 16, Dialect::Vllm));
        let empty = parse_announce(&serde_json::json!({"allow": []}), &mut errors);
        assert!(empty.is_some_and(|c| c.allow.is_empty()));
        assert!(errors[0].contains("allow: missing or empty"), "{errors:?}");
        errors.clear();
        parse_announce(&serde_json::json!({"allow": ["10.0.0.0/40", "x"]}), &mut errors);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(Cidr::parse("::/0").unwrap().contains("fd00::1".parse().unwrap()));
        assert!(!Cidr::parse("0.0.0.0/0").unwrap().contains("fd00::1".parse().unwrap()));
    }
}
