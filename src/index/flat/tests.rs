//! [`FlatTable`] against `std::collections::HashMap` under random inserts, updates, removals,
//! retains, clears and clones, with keys that collide on purpose so that runs are long, wrap
//! around the end of the slots and get shifted back by removals.

use std::collections::HashMap;

use super::*;

/// A key whose hash puts it in one of 4 places: every run is long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Clumped(u16);

impl FlatKey for Clumped {
    const FILLER: Self = Clumped(0);
    fn hash64(&self) -> u64 {
        // Homes near the end of the slots too, so runs wrap around to slot 0.
        [0, u64::MAX / 2, u64::MAX / 4 * 3, u64::MAX][usize::from(self.0 % 4)]
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Count(u32);

impl Vacancy for Count {
    fn is_vacant(&self) -> bool {
        self.0 == 0
    }
}

/// splitmix64, so every run checks the same sequence.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

fn add(t: &mut FlatTable<Clumped, Count>, k: Clumped) {
    match t.find(&k) {
        Ok(i) => t.at_mut(i).0 += 1,
        Err(at) => {
            t.insert_at(at, k, Count(1));
        }
    }
}

fn check(t: &FlatTable<Clumped, Count>, model: &HashMap<Clumped, u32>) {
    assert_eq!(t.len(), model.len());
    assert_eq!(t.iter().count(), model.len());
    for (k, v) in model {
        assert_eq!(t.get(k), Some(&Count(*v)), "{k:?}");
    }
    for k in (0..200).map(Clumped) {
        assert_eq!(t.get(&k).is_some(), model.contains_key(&k), "{k:?}");
    }
}

#[test]
fn agrees_with_a_hash_map_under_random_operations() {
    let mut rng = Rng(7);
    for limit in [3, 40, 1_000, usize::MAX] {
        let mut t = FlatTable::with_limit(limit);
        let mut model: HashMap<Clumped, u32> = HashMap::new();
        for step in 0..6_000 {
            let k = Clumped(rng.below(150) as u16);
            match rng.below(100) {
                0..=44 => {
                    add(&mut t, k);
                    *model.entry(k).or_default() += 1;
                }
                45..=89 => {
                    if let Ok(i) = t.find(&k) {
                        t.remove_at(i);
                    }
                    model.remove(&k);
                }
                90..=96 => {
                    let odd = rng.below(2);
                    t.retain(|_, v| {
                        if u64::from(v.0) % 2 == odd {
                            v.0 = 0;
                        }
                        v.0 != 0
                    });
                    model.retain(|_, v| u64::from(*v) % 2 != odd);
                }
                97 => {
                    let mut copy = FlatTable::with_capacity(5, 5);
                    add(&mut copy, Clumped(1));
                    copy.clone_from(&t);
                    t = copy;
                }
                98 => t = t.clone(),
                _ if step % 7 == 0 => {
                    t.clear();
                    model.clear();
                }
                _ => {}
            }
            check(&t, &model);
        }
    }
}

#[test]
fn growth_stops_at_the_capacity_of_the_limit_and_goes_past_it_only_when_it_must() {
    let mut t: FlatTable<Clumped, Count> = FlatTable::with_limit(100);
    (0..100).for_each(|k| add(&mut t, Clumped(k)));
    assert_eq!(t.slots.len(), capacity_for(100), "no growth past the limit's capacity");
    assert_eq!(max_len(t.slots.len()), 100);
    (100..110).for_each(|k| add(&mut t, Clumped(k)));
    assert_eq!(t.len(), 110);
    let c = capacity_for(100);
    assert_eq!(t.slots.len(), c + c / 2, "past it, growing by half again");
    let sized: FlatTable<Clumped, Count> = FlatTable::with_capacity(1_000, 100);
    assert_eq!(sized.slots.len(), capacity_for(100), "a capacity hint is bounded by the limit");
    assert_eq!(FlatTable::<Clumped, Count>::with_capacity(0, 9).slots.len(), 0);
}

#[test]
fn capacities_hold_what_they_promise() {
    for n in 0..2_000 {
        assert!(max_len(capacity_for(n)) >= n, "{n}");
        assert!(max_len(capacity_for(n)) < capacity_for(n).max(1), "always a vacant slot");
    }
}

#[test]
fn growing_ahead_of_a_batch_goes_through_the_capacities_of_growing_one_insert_at_a_time() {
    let (mut one, mut ahead) = (FlatTable::<Clumped, Count>::default(), FlatTable::default());
    let mut next = 1u16;
    for batch in [1u16, 5, 16, 3, 40, 100, 7] {
        if let Some(grown) = ahead.grown_for(usize::from(batch)) {
            assert_eq!((grown.len(), grown.iter().count()), (ahead.len(), ahead.len()));
            ahead = grown;
        }
        let cap = ahead.slots.len();
        for k in next..next + batch {
            for t in [&mut one, &mut ahead] {
                let at = t.find(&Clumped(k)).unwrap_err();
                t.insert_at(at, Clumped(k), Count(u32::from(k)));
            }
        }
        next += batch;
        assert_eq!(ahead.slots.len(), cap, "room was made ahead: no growth inside the batch");
        assert!(one.slots.len() <= cap && ahead.has_room(0));
        assert_eq!(one.slots.len(), ahead.slots.len(), "the same capacities");
    }
    assert!((1..next).all(|k| ahead.get(&Clumped(k)) == Some(&Count(u32::from(k)))));
}
