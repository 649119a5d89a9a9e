//! kvdir-sim: a simulated xLLM engine that publishes KV events (PUB live messages and ROUTER
//! snapshots). This crate is a placeholder until the streams issue; the encoders it will use
//! live in `kvdir::wire`.
