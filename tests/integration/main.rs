//! The core's integration tests, one test binary with a module per area: wire decoding (and its
//! robustness against arbitrary bytes), frames recorded from vLLM, the indexes against a naive
//! model ([`oracle`]), and the peer bench's adapter (over a copy of its [`harness`]).

mod harness;
mod oracle;

mod decode_robustness;
mod hybrid_oracle;
mod index_oracle;
mod peer_adapter;
mod sglang_fixtures;
mod shared_oracle;
mod vllm_fixtures;
mod vllm_history_fixtures;
mod vllm_hybrid_fixtures;
mod wire_decode;
