//! The pruned decision against the full one on random fleets: the same answer, the same
//! rotation, decision after decision.

use super::*;
use crate::car::{route_listed, DpHit, RankLoad, TtftParams};
use crate::registry::InstanceState;

/// A fleet as the router keeps it: the snapshot's candidates (with a stale queue, which a
/// decision must not read) and each instance's current queue and queued work apart.
struct Kept {
    base: Vec<Candidate>,
    waiting: Vec<u64>,
    queued: Vec<QueuedWork>,
    /// Hits on fewer ranks than the instance has (none where kvdir chooses its rank).
    hits: Vec<Vec<DpHit>>,
    /// The rank the client pinned.
    pinned: Option<u32>,
}

impl Fleet for Kept {
    fn len(&self) -> usize {
        self.base.len()
    }

    fn base(&self, i: usize) -> &Candidate {
        &self.base[i]
    }

    fn waiting(&self, i: usize) -> u64 {
        self.waiting[i]
    }

    fn queued(&self, i: usize) -> QueuedWork {
        self.queued[i]
    }

    fn plain(&self, i: usize) -> Candidate {
        let mut c = self.base[i].clone();
        c.queued = self.queued[i];
        if let Some(l) = &mut c.load {
            l.waiting_requests_num = self.waiting[i];
        }
        c.hits.clone_from(&self.hits[i]);
        pin(&mut c, self.pinned);
        c
    }

    fn pinned(&self) -> Option<u32> {
        self.pinned
    }
}

/// Where kvdir chooses `c`'s rank, the client's `pinned` one, as the router pins every candidate.
fn pin(c: &mut Candidate, pinned: Option<u32>) {
    if let (Some(r), true) = (pinned, c.dp_routing != DpRouting::Engine) {
        c.dp_routing = DpRouting::Pinned(r);
    }
}

/// xorshift64*: enough randomness for fleets, the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// An instance; with `roles`, of any role, else a DEFAULT one; kvdir chooses its rank about
/// `ranked` times in 100 (if it has more than one).
fn instance(rng: &mut Rng, i: usize, roles: bool, ranked: u64) -> Candidate {
    let kind = match if roles { rng.below(100) } else { 0 } {
        0..=84 => InstanceType::Default,
        85..=89 => InstanceType::Prefill,
        90..=94 => InstanceType::Mix,
        _ => InstanceType::Decode,
    };
    let usage = if rng.chance(3) { 1.5 } else { rng.pick(&[0.0, 0.5, 0.9]) };
    let load = LoadMetrics {
        waiting_requests_num: 1000 + rng.below(4),
        gpu_cache_usage_perc: usage,
        prefill_tokens_per_s: rng.chance(30).then(|| rng.pick(&[2000.0, 9000.0, 20_000.0])),
    };
    let dp_size = 1 + rng.below(4) as u32;
    let mut rank_loads = Vec::new();
    for r in 0..dp_size {
        if rng.chance(30) {
            let kv_usage = rng.pick(&[0.5, 0.5, 0.2]);
            rank_loads.push(RankLoad { dp_rank: r, waiting: rng.below(3), kv_usage });
        }
    }
    Candidate {
        name: format!("e{i:03}"),
        kind,
        mix_acting_prefill: rng.chance(50),
        state: if rng.chance(5) { InstanceState::Suspect } else { InstanceState::Active },
        load: (!rng.chance(5)).then_some(load),
        dp_size,
        ttft_profile: vec![(1000.0, 50.0)],
        tpot_profile: Vec::new(),
        hits: Vec::new(),
        queued: QueuedWork::default(),
        dp_routing: match dp_size > 1 && rng.chance(ranked) {
            true => DpRouting::Kvdir,
            false => DpRouting::Engine,
        },
        rank_loads,
    }
}

fn queued(rng: &mut Rng, fleet: (f64, Option<f64>), typical_tokens: Option<f64>) -> QueuedWork {
    let (fleet_reuse, fleet_rate) = fleet;
    let requests = rng.pick(&[0, 0, 1, 2, 5]);
    QueuedWork {
        tokens: requests as f64 * rng.pick(&[100.0, 700.0, 3000.0]),
        requests,
        learned_rate: if rng.chance(10) { Some(rng.pick(&[1500.0, 40_000.0])) } else { fleet_rate },
        fleet_reuse,
        typical_tokens,
    }
}

/// The candidate of an instance with a part of the prompt: hits on its ranks (some missing or
/// unsynchronized), predicted tokens, or neither (siblings in flight), with kvdir choosing its
/// rank now and then.
fn credited(rng: &mut Rng, plain: &Candidate, input: usize) -> Candidate {
    let mut c = plain.clone();
    c.hits = ranks(rng, c.dp_size, input, 10);
    if rng.chance(10) {
        c.hits.clear();
    }
    if rng.chance(20) && c.dp_size > 1 {
        c.dp_routing = DpRouting::Kvdir;
    }
    c
}

/// Hits on each of `dp` ranks but about `missing` in 100 of them.
fn ranks(rng: &mut Rng, dp: u32, input: usize, missing: u64) -> Vec<DpHit> {
    let hit = |rng: &mut Rng, dp_rank| DpHit {
        dp_rank,
        synchronized: !rng.chance(10),
        identity_matches: !rng.chance(5),
        partial: false,
        device_hit_tokens: rng.below(input as u64 / 2 + 1),
        host_only_hit_tokens: rng.pick(&[0, 64]),
        predicted_hit_tokens: rng.pick(&[0, 0, 128]),
        approximate: false,
    };
    let mut hits = Vec::new();
    for r in 0..dp {
        if !rng.chance(missing) {
            let h = hit(rng, r);
            hits.push(h);
        }
    }
    hits
}

fn params(rng: &mut Rng) -> RouteParams {
    RouteParams {
        policy: rng.pick(&[Policy::Car, Policy::Ttft, Policy::Ttft, Policy::Rr]),
        lambda: rng.pick(&[0.0, 0.5, 1.0, 0.3]),
        host_weight: rng.pick(&[0.0, 0.5]),
        directory_enabled: !rng.chance(5),
        predict_weight: rng.pick(&[0.0, 0.5, 1.0]),
        ttft: TtftParams {
            later_weight: rng.pick(&[0.0, 12.0]),
            queue_weight: rng.pick(&[0.0, 0.05]),
            ..TtftParams::default()
        },
        ..RouteParams::default()
    }
}

/// One random fleet, decided several times over by both decisions.
fn compare(rng: &mut Rng) -> usize {
    let most = if rng.chance(20) { 300 } else { 40 };
    let n = 1 + rng.below(most) as usize;
    let roles = rng.chance(30);
    let ranked = rng.pick(&[0, 0, 3, 30, 100]);
    let base: Vec<Candidate> = (0..n).map(|i| instance(rng, i, roles, ranked)).collect();
    let waiting: Vec<u64> = (0..n).map(|_| rng.pick(&[0, 0, 1, 2, 3, 7])).collect();
    let (reuse, rate) = (rng.pick(&[0.0, 0.3, 0.5]), rng.chance(50).then_some(8000.0));
    let typical = rng.chance(70).then(|| rng.pick(&[200.0, 1500.0]));
    let queued: Vec<QueuedWork> = (0..n).map(|_| queued(rng, (reuse, rate), typical)).collect();
    // Some instances hold part of the prompt on some of their ranks, which credits nothing.
    let mut hits: Vec<Vec<DpHit>> = Vec::new();
    for c in &base {
        let mut some = if rng.chance(30) { ranks(rng, c.dp_size, 1000, 50) } else { Vec::new() };
        some.truncate(c.dp_size as usize - 1);
        if c.dp_routing != DpRouting::Engine {
            // Any hit on a rank kvdir chooses is its credit: the router builds that instance.
            some.clear();
        }
        hits.push(some);
    }
    let pinned = rng.chance(15).then(|| rng.below(3) as u32);
    let fleet = Kept { base, waiting, queued, hits, pinned };
    let input = rng.pick(&[1, 300, 1000, 4096]);
    let share = rng.pick(&[0, 5, 20, 100]);
    let mut with_credit = Vec::new();
    for i in 0..n {
        if rng.chance(share) {
            let mut c = credited(rng, &fleet.plain(i), input);
            pin(&mut c, pinned);
            with_credit.push((i, c));
        }
    }
    let credited = with_credit;
    let mut excluded: Vec<usize> = Vec::new();
    for _ in 0..rng.below(3) {
        excluded.push(rng.below(n as u64) as usize);
    }
    excluded.retain(|i| credited.binary_search_by_key(i, |(at, _)| *at).is_err());
    let full: Vec<Candidate> = (0..n)
        .filter(|i| !excluded.contains(i))
        .map(|i| match credited.iter().find(|(at, _)| *at == i) {
            Some((_, c)) => c.clone(),
            None => fleet.plain(i),
        })
        .collect();
    let p = params(rng);
    let (prefill, decode) = (rng.below(50), rng.below(50));
    let start = Rotation { prefill, decode, rank: rng.below(50) };
    let (mut all, mut pruned, mut decided) = (start, start, 0);
    for _ in 0..3 {
        let want = route_listed(&full, input, &p, &mut all, true);
        match route_pruned(&fleet, &credited, &excluded, input, &p, &mut pruned) {
            Some(got) => {
                assert_eq!(got, want, "fleet of {n}, {} credited, {p:?}", credited.len());
                decided += 1;
            }
            None => pruned = all,
        }
        assert_eq!(pruned, all, "the same rotation after each decision");
    }
    decided
}

#[test]
fn the_pruned_decision_is_the_full_one_on_random_fleets() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let decided: usize = (0..3000).map(|_| compare(&mut rng)).sum();
    // Most fleets qualify (CAR or TTFT, no decode side).
    assert!(decided > 4000, "pruned decisions compared: {decided}");
}

#[test]
fn plain_instances_whose_rank_kvdir_chooses_turn_the_rank_counter_as_the_full_decision() {
    // Four idle two-rank instances, kvdir choosing the rank of b and d, which hold nothing:
    // both tie on their ranks, so each moves the counter before c, which is built.
    let idle = |name: &str| Candidate::test_idle(name, 2, 0);
    let mut base = vec![idle("a"), idle("b"), idle("c"), idle("d")];
    (base[1].dp_routing, base[3].dp_routing) = (DpRouting::Kvdir, DpRouting::Kvdir);
    base.iter_mut().for_each(|c| c.hits.clear());
    let n = base.len();
    let hits = vec![Vec::new(); n];
    let (waiting, queued) = (vec![0; n], vec![QueuedWork::default(); n]);
    let mut fleet = Kept { base, waiting, queued, hits, pinned: None };
    // c is listed with nothing on either rank: built, and its ranks tie too.
    let credited = [(2, Candidate { dp_routing: DpRouting::Kvdir, ..idle("c") })];
    for pinned in [None, Some(1)] {
        fleet.pinned = pinned;
        let full: Vec<Candidate> = (0..n).map(|i| fleet.plain(i)).collect();
        let full = [&full[..2], &[credited[0].1.clone()], &full[3..]].concat();
        let (mut all, mut pruned) = (Rotation::default(), Rotation::default());
        for _ in 0..3 {
            let want = route_listed(&full, 100, &RouteParams::default(), &mut all, true);
            let got =
                route_pruned(&fleet, &credited, &[], 100, &RouteParams::default(), &mut pruned);
            assert_eq!(got, Some(want), "pinned {pinned:?}");
            assert_eq!(pruned, all);
        }
        let moves = if pinned.is_some() { 3 } else { 9 };
        assert_eq!(all.rank, moves, "b, c and d each tie (pinned: c alone), three times");
    }
}

#[test]
fn pruning_steps_aside_where_its_proof_does_not_hold() {
    let idle = |name: &str, hit| Candidate::test_idle(name, 2, hit);
    let mut fleet = Kept {
        base: vec![idle("a", 0), idle("b", 0)],
        waiting: vec![0, 0],
        queued: vec![QueuedWork::default(); 2],
        hits: vec![Vec::new(); 2],
        pinned: None,
    };
    let p = RouteParams::default();
    let decide = |fleet: &Kept, p: &RouteParams| {
        route_pruned(fleet, &[], &[], 100, p, &mut Rotation::default()).map(|r| r.unwrap().prefill)
    };
    assert_eq!(decide(&fleet, &p), Some("a".to_string()));
    assert_eq!(decide(&fleet, &RouteParams { policy: Policy::Rr, ..p.clone() }), None);
    fleet.base[1].kind = InstanceType::Decode;
    assert_eq!(decide(&fleet, &p), None, "a decode side is scored whole");
}
