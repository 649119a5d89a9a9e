//! ZeroMQ TCP endpoints as the config names them: which are connectable, and the one canonical
//! form they are compared in, so that two spellings of one socket count as the same endpoint.
//!
//! Canonical form: `tcp://HOST:PORT` with the port as a plain number and
//! - `localhost` (any case, with or without a trailing dot) as `127.0.0.1`: ZeroMQ resolves it to
//!   IPv4 unless IPv6 is enabled on the socket, which kvdir never does;
//! - IPv4 literals as `a.b.c.d`, IPv6 literals bracketed and compressed (`[::1]`), and
//!   IPv4-mapped IPv6 literals (`[::ffff:10.0.0.1]`) as the IPv4 address they map;
//! - DNS names lowercased without a trailing dot (names are case-insensitive). Two different
//!   names of one host cannot be told apart without resolving them, which config validation
//!   does not do.

use std::net::{IpAddr, Ipv4Addr};

/// A host in canonical form, or `None` when it is empty.
fn canonical_host(host: &str) -> Option<String> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(match ip.to_canonical() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        });
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    match name.as_str() {
        "" => None,
        "localhost" => Some(Ipv4Addr::LOCALHOST.to_string()),
        _ => Some(name),
    }
}

/// The canonical form of a `tcp://host:port` endpoint (see the module documentation), or
/// `None` when it is not one.
pub fn canonical_endpoint(ep: &str) -> Option<String> {
    let (host, port) = ep.strip_prefix("tcp://")?.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    Some(format!("tcp://{}:{port}", canonical_host(host)?))
}

/// A connectable TCP endpoint: `tcp://host:port` with a concrete host (not `*` nor an
/// unspecified address in any spelling) and a port in 1..=65535.
pub fn check_endpoint(ep: &str) -> Result<(), String> {
    let Some(rest) = ep.strip_prefix("tcp://") else {
        return Err("must start with tcp://".into());
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err("must be tcp://host:port".into());
    };
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let unspecified = bare.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_unspecified());
    if host.is_empty() || host == "*" || unspecified {
        return Err(format!("host {host:?} is not connectable; use the engine's address"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("port {port:?} is not in 1..=65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_socket_share_a_canonical_form() {
        let loopback = Some("tcp://127.0.0.1:18000".to_string());
        for ep in [
            "tcp://127.0.0.1:18000",
            "tcp://localhost:18000",
            "tcp://LocalHost.:18000",
            "tcp://127.0.0.1:018000",
            "tcp://[::ffff:127.0.0.1]:18000",
        ] {
            assert_eq!(canonical_endpoint(ep), loopback, "{ep}");
        }
        let v6 = Some("tcp://[::1]:1".to_string());
        assert_eq!(canonical_endpoint("tcp://[0:0:0:0:0:0:0:1]:1"), v6);
        assert_eq!(canonical_endpoint("tcp://[::1]:1"), v6, "IPv6 loopback is its own socket");
        assert_eq!(
            canonical_endpoint("tcp://Engine-A.example:1"),
            Some("tcp://engine-a.example:1".into())
        );
        assert_eq!(canonical_endpoint("tcp://:1"), None);
        assert_eq!(canonical_endpoint("tcp://h:99999"), None);
        assert_eq!(canonical_endpoint("ipc:///tmp/x"), None);
    }

    #[test]
    fn unspecified_addresses_are_refused_in_every_spelling() {
        for ep in [
            "tcp://0.0.0.0:1",
            "tcp://[::]:1",
            "tcp://[0:0:0:0:0:0:0:0]:1",
            "tcp://[::ffff:0.0.0.0]:1",
            "tcp://*:1",
        ] {
            assert!(check_endpoint(ep).unwrap_err().contains("is not connectable"), "{ep}");
        }
    }
}
