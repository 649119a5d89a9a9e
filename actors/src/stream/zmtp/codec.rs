//! The ZMTP 3.0 wire format as a SUB or DEALER socket with the NULL mechanism speaks it
//! (RFC 23): the 64-byte greeting, frames (a flags byte, a 1- or 8-byte size, the body), the
//! READY command naming the socket type, a subscription (a data message whose first byte is 1,
//! as ZMTP 3.0 subscribes), a message, and PING's answer. Pure: bytes in, bytes or a parsed
//! item out.
//!
//! kvdir's greeting says version 3.0, so a ZMTP 3.1 publisher (libzmq 4.3, pyzmq) speaks 3.0
//! to it: subscriptions as messages, which every 3.x publisher accepts. A 3.1 peer's PING is
//! answered with a PONG all the same.

use std::ops::Range;

/// A greeting's length.
pub const GREETING_LEN: usize = 64;
/// Frame flags.
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

/// Why a peer's bytes are refused (the connection is dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZmtpError {
    /// Not a ZMTP 3.x greeting, or not the NULL mechanism.
    Greeting(String),
    /// The peer's READY is malformed or names a socket type this side cannot talk to.
    Ready(String),
    /// A frame above the size limit.
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A command inside a multipart message.
    Framing(String),
    /// The peer sent ERROR.
    PeerError(String),
}

impl std::fmt::Display for ZmtpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZmtpError::Greeting(s) => write!(f, "not a ZMTP 3 NULL-mechanism publisher: {s}"),
            ZmtpError::Ready(s) => write!(f, "bad ZMTP READY: {s}"),
            ZmtpError::TooLarge { size, max } => {
                write!(f, "a frame of {size} bytes exceeds the limit of {max} (max_message_bytes)")
            }
            ZmtpError::Framing(s) => write!(f, "bad ZMTP framing: {s}"),
            ZmtpError::PeerError(s) => write!(f, "the publisher refused the connection: {s}"),
        }
    }
}

/// kvdir's greeting: signature (with libzmq's padding), version 3.0, NULL, client.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[8] = 1;
    g[9] = 0x7F;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Checks a peer's greeting: ZMTP 3.x with the NULL mechanism.
pub fn check_greeting(g: &[u8]) -> Result<(), ZmtpError> {
    if g.len() < GREETING_LEN {
        return Err(ZmtpError::Greeting("no ZMTP 3 signature".into()));
    }
    check_signature(g)?;
    let mechanism = &g[12..32];
    let name_end = mechanism.iter().position(|&b| b == 0).unwrap_or(mechanism.len());
    if &mechanism[..name_end] != b"NULL" {
        let name = String::from_utf8_lossy(&mechanism[..name_end]).into_owned();
        return Err(ZmtpError::Greeting(format!("mechanism {name:?} (only NULL is supported)")));
    }
    Ok(())
}

/// Checks the first bytes of a greeting, whole or not yet: the signature's first and tenth
/// byte (libzmq pads the rest), and a major version of 3 or more.
pub fn check_signature(g: &[u8]) -> Result<(), ZmtpError> {
    let bad = g.first().is_some_and(|&b| b != 0xFF) || g.get(9).is_some_and(|&b| b & 1 == 0);
    if bad {
        return Err(ZmtpError::Greeting("no ZMTP 3 signature".into()));
    }
    match g.get(10) {
        Some(&major) if major < 3 => {
            let minor = g.get(11).map_or("x".to_string(), u8::to_string);
            Err(ZmtpError::Greeting(format!("version {major}.{minor} (3.0 or later needed)")))
        }
        _ => Ok(()),
    }
}

/// Appends one frame.
fn frame(flags: u8, body: &[&[u8]], out: &mut Vec<u8>) {
    let size: usize = body.iter().map(|b| b.len()).sum();
    if size <= 255 {
        out.extend_from_slice(&[flags, size as u8]);
    } else {
        out.push(flags | LONG);
        out.extend_from_slice(&(size as u64).to_be_bytes());
    }
    body.iter().for_each(|b| out.extend_from_slice(b));
}

/// Which socket kvdir's side of a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A SUB socket (a live stream).
    Sub,
    /// A DEALER socket (a replay request).
    Dealer,
}

impl Role {
    /// The socket type READY names.
    fn name(self) -> &'static [u8] {
        match self {
            Role::Sub => b"SUB",
            Role::Dealer => b"DEALER",
        }
    }

    /// The socket types of peers it talks to (ZMTP's compatibility table).
    fn peers(self) -> &'static [&'static [u8]] {
        match self {
            Role::Sub => &[b"PUB", b"XPUB"],
            Role::Dealer => &[b"ROUTER", b"DEALER", b"REP"],
        }
    }
}

/// Appends `role`'s READY command.
pub fn ready(role: Role, out: &mut Vec<u8>) {
    let name = b"Socket-Type";
    let value = role.name();
    let (n, v) = ([name.len() as u8], (value.len() as u32).to_be_bytes());
    frame(COMMAND, &[b"\x05READY", &n, name, &v, value], out);
}

/// Appends a message of `frames`.
pub fn message(frames: &[&[u8]], out: &mut Vec<u8>) {
    for (i, f) in frames.iter().enumerate() {
        frame(if i + 1 < frames.len() { MORE } else { 0 }, &[f], out);
    }
}

/// Appends a subscription to `topic` (every message whose first frame starts with it).
pub fn subscribe(topic: &[u8], out: &mut Vec<u8>) {
    frame(0, &[b"\x01", topic], out);
}

/// Appends the PONG answering a PING whose data (TTL and context) is `ping`.
pub fn pong(ping: &[u8], out: &mut Vec<u8>) {
    let context = ping.get(2..).unwrap_or_default();
    frame(COMMAND, &[b"\x04PONG", &context[..context.len().min(16)]], out);
}

/// What the next bytes hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// More bytes are needed.
    Partial,
    /// A command: its name and data, as ranges of the input.
    Command {
        /// The bytes it took.
        len: usize,
        /// Its name.
        name: Range<usize>,
        /// Its data.
        data: Range<usize>,
    },
    /// A message, its frames in the caller's ranges.
    Message {
        /// The bytes it took.
        len: usize,
    },
}

/// One frame's header at the start of `b`: flags, header length and body size.
fn header(b: &[u8]) -> Option<(u8, usize, u64)> {
    let flags = *b.first()?;
    if flags & LONG == 0 {
        Some((flags, 2, u64::from(*b.get(1)?)))
    } else {
        let size: [u8; 8] = b.get(1..9)?.try_into().ok()?;
        Some((flags, 9, u64::from_be_bytes(size)))
    }
}

/// Parses the next command or whole message of `b`; a message's frames are written to
/// `frames` (ranges of `b`). Frames above `max` bytes are refused as soon as their header is
/// read.
pub fn next_item(b: &[u8], max: u64, frames: &mut Vec<Range<usize>>) -> Result<Item, ZmtpError> {
    let mut at = 0;
    frames.clear();
    loop {
        let Some((flags, head, size)) = header(&b[at..]) else { return Ok(Item::Partial) };
        if size > max {
            return Err(ZmtpError::TooLarge { size, max });
        }
        let start = at + head;
        let end = start + size as usize;
        if b.len() < end {
            return Ok(Item::Partial);
        }
        if flags & COMMAND != 0 {
            if !frames.is_empty() {
                return Err(ZmtpError::Framing("a command inside a message".into()));
            }
            let n = b.get(start).map_or(0, |&n| n as usize);
            if size == 0 || 1 + n > size as usize {
                return Err(ZmtpError::Framing("a command with a bad name".into()));
            }
            let name = start + 1..start + 1 + n;
            return Ok(Item::Command { len: end, data: name.end..end, name });
        }
        frames.push(start..end);
        at = end;
        if flags & MORE == 0 {
            return Ok(Item::Message { len: end });
        }
    }
}

/// Checks a READY command's data: its `Socket-Type` must be one `role` talks to.
pub fn check_ready(role: Role, mut data: &[u8]) -> Result<(), ZmtpError> {
    let mut socket_type = None;
    while !data.is_empty() {
        let n = data[0] as usize;
        let name = data.get(1..1 + n).ok_or_else(|| ZmtpError::Ready("truncated name".into()))?;
        let size = data.get(1 + n..5 + n).ok_or_else(|| ZmtpError::Ready("truncated".into()))?;
        let size = u32::from_be_bytes(size.try_into().unwrap_or_default()) as usize;
        let value = data
            .get(5 + n..5 + n + size)
            .ok_or_else(|| ZmtpError::Ready("truncated value".into()))?;
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            socket_type = Some(value);
        }
        data = &data[5 + n + size..];
    }
    match socket_type {
        Some(t) if role.peers().contains(&t) => Ok(()),
        Some(other) => Err(ZmtpError::Ready(format!(
            "socket type {} (a {} talks to {})",
            String::from_utf8_lossy(other),
            String::from_utf8_lossy(role.name()),
            role.peers().iter().map(|p| String::from_utf8_lossy(p)).collect::<Vec<_>>().join(", ")
        ))),
        None => Err(ZmtpError::Ready("no Socket-Type".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges() -> Vec<Range<usize>> {
        Vec::new()
    }

    #[test]
    fn greetings_are_checked() {
        let g = greeting();
        assert_eq!(g.len(), 64);
        assert_eq!(check_greeting(&g), Ok(()));
        let mut v2 = g;
        v2[10] = 2;
        assert!(matches!(check_greeting(&v2), Err(ZmtpError::Greeting(s)) if s.contains("2.0")));
        let mut plain = g;
        plain[12..17].copy_from_slice(b"PLAIN");
        assert!(check_greeting(&plain).unwrap_err().to_string().contains("PLAIN"));
        assert!(check_greeting(&[0; 64]).is_err());
        for n in 0..64 {
            assert_eq!(check_signature(&g[..n]), Ok(()), "a greeting's first {n} bytes");
        }
        assert!(check_signature(b"GET / HTTP/1.1").is_err(), "refused at its first byte");
        assert!(check_signature(&v2[..11]).is_err(), "refused at its version");
        assert!(check_signature(&[0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn messages_and_commands_parse_in_place_short_and_long() {
        let mut b = Vec::new();
        ready(Role::Sub, &mut b);
        let long = vec![7u8; 300];
        frame(MORE, &[b"topic"], &mut b);
        frame(MORE, &[&[0, 1]], &mut b);
        frame(0, &[&long], &mut b);
        let mut f = ranges();
        let Item::Command { len, name, data } = next_item(&b, 1000, &mut f).unwrap() else {
            panic!("READY first")
        };
        assert_eq!(&b[name], b"READY");
        let refused = check_ready(Role::Sub, &b[data.clone()]);
        assert!(matches!(refused, Err(ZmtpError::Ready(s)) if s.contains("SUB talks to PUB")));
        assert_eq!(
            check_ready(Role::Dealer, &b[data.clone()]),
            Err(ZmtpError::Ready("socket type SUB (a DEALER talks to ROUTER, DEALER, REP)".into()))
        );
        let rest = &b[len..];
        assert_eq!(next_item(rest, 1000, &mut f), Ok(Item::Message { len: rest.len() }));
        assert_eq!(f.len(), 3);
        assert_eq!((&rest[f[0].clone()], &rest[f[1].clone()]), (&b"topic"[..], &[0u8, 1][..]));
        assert_eq!(&rest[f[2].clone()], &long[..]);
        for cut in 0..rest.len() {
            assert_eq!(next_item(&rest[..cut], 1000, &mut f), Ok(Item::Partial), "{cut}");
        }
        let too_large = next_item(rest, 299, &mut f);
        assert_eq!(too_large, Err(ZmtpError::TooLarge { size: 300, max: 299 }));
    }

    #[test]
    fn a_publishers_ready_is_accepted_and_others_are_not() {
        let ready = |t: &[u8]| {
            let mut d = vec![11];
            d.extend_from_slice(b"socket-type");
            d.extend_from_slice(&(t.len() as u32).to_be_bytes());
            d.extend_from_slice(t);
            d
        };
        assert_eq!(check_ready(Role::Sub, &ready(b"PUB")), Ok(()));
        assert_eq!(check_ready(Role::Sub, &ready(b"XPUB")), Ok(()));
        assert!(check_ready(Role::Sub, &ready(b"ROUTER")).is_err());
        assert_eq!(check_ready(Role::Dealer, &ready(b"ROUTER")), Ok(()));
        assert!(check_ready(Role::Dealer, &ready(b"PUB")).is_err());
        assert!(check_ready(Role::Sub, &[]).is_err());
        assert!(check_ready(Role::Sub, &ready(b"PUB")[..14]).is_err());
    }

    #[test]
    fn framing_errors_are_refused_and_pings_answered() {
        let mut b = Vec::new();
        frame(MORE, &[b"t"], &mut b);
        frame(COMMAND, &[b"\x04PING", &[0, 10], b"ctx"], &mut b);
        assert!(matches!(next_item(&b, 100, &mut ranges()), Err(ZmtpError::Framing(_))));
        let mut five = Vec::new();
        (0..4).for_each(|_| frame(MORE, &[b"x"], &mut five));
        frame(0, &[b"y"], &mut five);
        let mut f = ranges();
        assert_eq!(next_item(&five, 100, &mut f), Ok(Item::Message { len: five.len() }));
        assert_eq!(f.len(), 5);
        let mut out = Vec::new();
        pong(&[0, 10, b'c', b't', b'x'], &mut out);
        assert_eq!(out, b"\x04\x08\x04PONGctx");
        let mut s = Vec::new();
        subscribe(b"kv", &mut s);
        assert_eq!(s, b"\x00\x03\x01kv");
        let mut m = Vec::new();
        message(&[b"", &[0, 7]], &mut m);
        assert_eq!(m, b"\x01\x00\x00\x02\x00\x07");
    }
}
