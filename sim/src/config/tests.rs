//! Validation, the port rules and the wire shapes of [`EngineConfig`].

use super::*;

#[test]
fn default_is_valid_and_ephemeral() {
    let c = EngineConfig::default();
    assert!(c.validate().is_ok());
    assert_eq!(c.event_bind_address(3), "tcp://127.0.0.1:*");
}

#[test]
fn every_problem_is_reported_with_its_value() {
    let c = EngineConfig {
        name: String::new(),
        dp_size: 0,
        block_size: 0,
        device_capacity_blocks: 0,
        ..EngineConfig::default()
    };
    let c = EngineConfig { dialect: Dialect::Sglang, buffer_steps: 0, ..c };
    let msg = c.validate().unwrap_err().to_string();
    let needles = ["name is empty", "dp_size = 0", "block_size = 0", "device_capacity_blocks"];
    for needle in needles.into_iter().chain(["sglang is not simulated", "buffer_steps = 0"]) {
        assert!(msg.contains(needle), "{msg}");
    }
}

#[test]
fn port_overflow_and_overlap_are_rejected() {
    let c = EngineConfig { event_port: 65535, dp_size: 2, ..EngineConfig::default() };
    assert!(c.validate().unwrap_err().to_string().contains("needs port 65536"));
    let c = EngineConfig {
        event_port: 18000,
        replay_port: 18001,
        dp_size: 2,
        ..EngineConfig::default()
    };
    assert!(c.validate().unwrap_err().to_string().contains("overlap"));
    let c = EngineConfig {
        event_port: 18000,
        replay_port: 18002,
        dp_size: 2,
        ..EngineConfig::default()
    };
    assert!(c.validate().is_ok());
    assert_eq!(c.replay_bind_address(1), "tcp://127.0.0.1:18003");
}

#[test]
fn http_port_derives_zmq_ports_by_the_discovery_rule() {
    let c = EngineConfig { http_port: 8000, dp_size: 2, ..EngineConfig::default() };
    assert!(c.validate().is_ok());
    let r = c.resolved();
    assert_eq!((r.event_port, r.replay_port), (18000, 38000));
    assert_eq!(r.replay_bind_address(1), "tcp://127.0.0.1:38001");
    assert_eq!(c.instance_name(), "127.0.0.1:8000");
    let explicit = EngineConfig { event_port: 20000, ..c.clone() };
    assert_eq!(explicit.resolved().event_port, 20000);
    assert_eq!(explicit.resolved().replay_port, 0);
    let c = EngineConfig { http_port: 40000, ..EngineConfig::default() };
    assert!(c.validate().unwrap_err().to_string().contains("needs port 70000"));
    let c = EngineConfig { http_port: 8000, event_port_offset: 0, ..EngineConfig::default() };
    assert!(c.validate().unwrap_err().to_string().contains("http_port = 8000 lies inside"));
    let same =
        EngineConfig { http_port: 8000, replay_port_offset: 10000, ..EngineConfig::default() };
    assert!(same.validate().unwrap_err().to_string().contains("overlap"));
    assert_eq!(EngineConfig::default().instance_name(), "sim-0");
}

#[test]
fn connect_mode_connects_rank_r_to_port_p_plus_r() {
    let c = EngineConfig {
        events_connect: Some("tcp://127.0.0.1:5557".into()),
        dp_size: 2,
        ..EngineConfig::default()
    };
    assert!(c.validate().is_ok());
    assert_eq!(c.event_side(1), EventSide::Connect("tcp://127.0.0.1:5558".into()));
    let derived = EngineConfig { http_port: 8000, ..c.clone() };
    assert_eq!(derived.resolved().event_port, 0, "a connecting PUB binds no port");
    assert_eq!(derived.resolved().replay_port, 38000);
    let msg = EngineConfig { events_connect: Some("127.0.0.1:5557".into()), ..c.clone() }
        .validate()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is not tcp://host:port"), "{msg}");
    let high = EngineConfig { events_connect: Some("tcp://h:65535".into()), ..c.clone() };
    assert!(high.validate().unwrap_err().to_string().contains("needs port 65536"));
    let both = EngineConfig { event_port: 9000, ..c };
    assert!(both.validate().unwrap_err().to_string().contains("set event_port = 0"));
}

#[test]
fn bin32_hashes_are_32_bytes_and_deterministic() {
    let WireHash::Bin(a) = HashMode::Bin32.to_wire(7) else { panic!("not bin") };
    assert_eq!(a.len(), 32);
    assert_eq!(HashMode::Bin32.to_wire(7), WireHash::Bin(a));
    assert_ne!(HashMode::Bin32.to_wire(7), HashMode::Bin32.to_wire(8));
    assert_eq!(HashMode::U64.to_wire(7), WireHash::Uint(7));
}

#[test]
fn no_engine_reuses_the_last_prompt_token() {
    let vllm = EngineConfig { block_size: 4, dialect: Dialect::Vllm, ..EngineConfig::default() };
    assert_eq!([12, 13, 1, 0].map(|len| vllm.reused_tokens(len, 12)), [8, 12, 0, 0]);
    assert_eq!(vllm.reused_tokens(100, 12), 12, "never more than is cached");
    let xllm = EngineConfig { block_size: 4, ..EngineConfig::default() };
    assert_eq!(xllm.reused_tokens(12, 12), 8);
}
