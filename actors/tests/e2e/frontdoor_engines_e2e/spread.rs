//! Requests in flight through the front door: a burst that would all hit one cache is spread
//! by the requests kvdir knows are in flight, and siblings of one new prompt stay together with
//! predict-on-route and spread without it.

use super::*;

#[test]
fn requests_in_flight_spread_a_burst_that_would_all_hit_one_cache() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-burst-{}", std::process::id());
    // Slow prefill: a burst is still in flight when its last request is routed.
    let openai = costs(3_000, 0, 1);
    let engines: Vec<_> = (0..3).map(|_| serving(&etcd.endpoint, &ns, &openai)).collect();
    let svc = kvdir(&etcd.endpoint, &ns, Policy::Car);
    ready(&svc, 3);
    let system = long_system_prompt();
    let warm = conversation(&system, "warm up");
    let r = chat(&svc, &warm, false);
    assert_eq!(r.status().as_u16(), 200);
    let holder = header(&r, "x-kvdir-instance");
    let prompt = tokens_of(&warm);
    eventually("the prompt in kvdir's directory", || {
        match find_entry(&query(&svc, &prompt), &holder, 0) {
            Some(m) if m.device_hit_tokens > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // The holder's load report taken during the warm-up is replaced by an idle one.
    eventually("every engine reporting an empty queue", || {
        let inst = http(svc.http_addr(), "GET", "/v1/internal/instances", &[], b"").json();
        let busy: Vec<Value> = inst["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["waiting_requests_num"] != 0)
            .cloned()
            .collect();
        if busy.is_empty() {
            Ok(())
        } else {
            Err(format!("{busy:?}"))
        }
    });
    // Eight requests at once, each a hit on `holder` only. Load reports come every second at
    // best; without its own in-flight count kvdir would send all eight there.
    let bodies = (0..8)
        .map(|i| json!({"model": MODEL, "messages": conversation(&system, &format!("burst {i}"))}))
        .collect();
    let chosen = burst(&svc, bodies);
    let on_holder = chosen.iter().filter(|c| **c == holder).count();
    assert!((1..8).contains(&on_holder), "spread: {chosen:?}");
    drop(engines);
}

/// Sends every body in `bodies` to the front door at once; the instances that served them.
fn burst(svc: &kvdir_service::Service, bodies: Vec<Value>) -> Vec<String> {
    let svc_addr = svc.http_addr();
    let start = Arc::new(std::sync::Barrier::new(bodies.len()));
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                let r = client()
                    .post(format!("http://{svc_addr}/v1/chat/completions"))
                    .json(&body)
                    .send()
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                header(&r, "x-kvdir-instance")
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn siblings_of_one_new_prompt_stay_together_with_prediction_and_spread_without_it() {
    let etcd = etcd_endpoint();
    let ns = format!("fd-siblings-{}", std::process::id());
    // Slow prefill: every sibling is still in flight when the last one is routed.
    let openai = costs(3_000, 0, 1);
    let engines: Vec<_> = (0..3).map(|_| serving(&etcd.endpoint, &ns, &openai)).collect();
    let predicting = kvdir(&etcd.endpoint, &ns, Policy::Car);
    let (_tmp, dir) = model_dir();
    let mut flags = Flags {
        front: FrontDoorFlags {
            tokenizer_path: Some(dir),
            policy: Policy::Car,
            ..Default::default()
        },
        ..Flags::default()
    };
    flags.route.predict_ttl_ms = 0;
    let exact_only = discovery_service(&etcd.endpoint, &ns, json!({}), flags);
    ready(&predicting, 3);
    ready(&exact_only, 3);
    let siblings = |question: &str| {
        let messages = conversation(&long_system_prompt(), question);
        vec![json!({"model": MODEL, "messages": messages}); 8]
    };
    // Eight copies of a prompt no engine has seen: the first one's placement is expected, and
    // its in-flight twins do not count as its queue.
    let together = burst(&predicting, siblings("sampled eight times"));
    assert!(together.iter().all(|c| *c == together[0]), "together: {together:?}");
    let recent = http(predicting.http_addr(), "GET", "/v1/internal/route/recent", &[], b"").json();
    let credited = recent["routes"].as_array().unwrap().iter().any(|r| {
        r["routed"]["candidates"].as_array().unwrap().iter().any(|c| {
            c["chosen"] == true && c["predicted_hit_ratio"].as_f64().is_some_and(|p| p > 0.9)
        })
    });
    assert!(credited, "the recent routes show the predicted term: {recent}");
    // With prediction off, the in-flight count spreads the same kind of burst.
    let spread = burst(&exact_only, siblings("sampled eight more times"));
    assert!(spread.iter().any(|c| *c != spread[0]), "spread: {spread:?}");
    drop(engines);
}
