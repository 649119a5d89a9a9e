//! Flag parsing of `kvdir-bench`: both forms, switches, defaults that depend on the mode, and
//! every problem reported with the fix.

use super::*;

fn parse(args: &[&str]) -> Result<BenchCommand, BenchError> {
    parse_args(args.iter().map(|s| s.to_string()))
}

fn run(args: &[&str]) -> BenchOptions {
    match parse(args) {
        Ok(BenchCommand::Run(o)) => *o,
        other => panic!("{args:?}: {other:?}"),
    }
}

fn problems(args: &[&str]) -> String {
    parse(args).unwrap_err().to_string()
}

#[test]
fn both_forms_switches_and_mode_dependent_defaults() {
    let o =
        run(&["--spawn_kvdir", "/bin/kvdir", "--engines=8", "--json", "--duration_seconds", "2.5"]);
    assert_eq!((o.engines, o.dp_size, o.json), (8, 2, true));
    assert_eq!(o.duration, Duration::from_millis(2500));
    assert_eq!((o.mode.clone(), o.route_clients, o.query_clients), (Mode::Static, 0, 1));
    assert_eq!((o.client_rate, o.heartbeat), (Some(20.0), Some(Duration::from_millis(500))));
    let o = run(&["--etcd_addr=127.0.0.1:2379", "--rate", "0", "--client_rate=50"]);
    assert_eq!(o.mode, Mode::Etcd { addr: "127.0.0.1:2379".into(), namespace: String::new() });
    assert_eq!((o.route_clients, o.rate, o.client_rate), (1, None, Some(50.0)));
    let o =
        run(&["--etcd_addr=localhost:2379", "--spawn_kvdir=k", "--kvdir_arg=--max_query_tokens=9"]);
    let Mode::Etcd { namespace, .. } = &o.mode else { panic!("etcd mode") };
    assert!(namespace.starts_with("kvdir-bench-"), "a private namespace when spawning");
    assert_eq!(o.kvdir_args, vec!["--max_query_tokens=9".to_string()]);
    assert_eq!(parse(&["--engines=x", "--help"]).unwrap(), BenchCommand::Help);
}

#[test]
fn bad_values_name_the_value_and_are_reported_together() {
    let msg = problems(&["--engines=x", "--rate=-1", "--duration_seconds=0", "--bogus=1", "stray"]);
    for needle in [
        "--engines = \"x\"",
        "--rate=\"-1\" is not a number of requests per second",
        "--duration_seconds = \"0\" is not a number of seconds in 0.1..=3600",
        "unknown flag --bogus",
        "\"stray\"",
        "run kvdir-bench --help",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in {msg}");
    }
}

#[test]
fn combinations_that_cannot_work_say_what_to_do() {
    let msg = problems(&[]);
    assert!(msg.contains("nothing tells kvdir about the engines: pass --etcd_addr"), "{msg}");
    let msg = problems(&["--write_config=/tmp/k.json", "--route_clients=2", "--etcd_namespace=x"]);
    assert!(msg.contains("--route_clients = 2 needs --etcd_addr"), "{msg}");
    assert!(msg.contains("--etcd_namespace needs --etcd_addr"), "{msg}");
    let msg = problems(&["--spawn_kvdir=k", "--engines=16385", "--dp_size=4"]);
    assert!(msg.contains("65540 streams; kvdir subscribes to at most 65536"), "{msg}");
    assert_eq!(run(&["--spawn_kvdir=k", "--engines=1024", "--dp_size=4"]).engines, 1024);
    let msg = problems(&["--spawn_kvdir=k", "--events_bind=65535", "--rank_threads=0"]);
    assert!(msg.contains("--events_bind = 65535 with --dp_size = 2 needs ports up to 65536"));
    assert!(msg.contains("--events_bind needs --etcd_addr"), "{msg}");
    assert!(msg.contains("--rank_threads = 0"), "{msg}");
    let msg = problems(&["--spawn_kvdir=k", "--engines_nice=20"]);
    assert!(msg.contains("--engines_nice = 20 is outside 0..=19"), "{msg}");
    assert_eq!(run(&["--spawn_kvdir=k", "--engines_nice=10"]).engines_nice, 10);
    let msg = problems(&["--spawn_kvdir=k", "--kvdir_addr=127.0.0.1:1"]);
    assert!(msg.contains("both name the kvdir"), "{msg}");
    let msg = problems(&["--spawn_kvdir=k", "--query_clients=0"]);
    assert!(msg.contains("give at least one client"), "{msg}");
}

#[test]
fn only_loopback_unless_allowed() {
    let msg = problems(&["--etcd_addr=10.0.0.1:2379", "--kvdir_addr=example.com:8888"]);
    assert!(msg.contains("--kvdir_addr = example.com:8888 is not on this host"), "{msg}");
    assert!(msg.contains("--etcd_addr = 10.0.0.1:2379 is not on this host"), "{msg}");
    let o = run(&["--etcd_addr=10.0.0.1:2379", "--kvdir_addr=example.com:8888", "--allow_remote"]);
    assert_eq!(o.kvdir_addr, "example.com:8888");
    run(&["--etcd_addr=http://[::1]:2379", "--kvdir_addr=127.0.0.2:1"]);
}
