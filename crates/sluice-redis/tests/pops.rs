//! Pops from the ends of sorted sets and sets, which start their scans
//! where the last pop left off (`Db::end_hints`), give exactly what a model
//! gives, whatever adds land between them and at either end.

use rand::{Rng, SeedableRng};
use sluice_redis::zset::{self, AddFlags};
use sluice_redis::{set, Ctx, Db};
use sluice_store::{Store, StoreConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn db() -> Db {
    let dev = Arc::new(sluice_io::MemoryDevice::new(4096, 64 << 10));
    let store = Store::create(dev, &StoreConfig::default()).expect("a store on a memory device");
    Db::open(Arc::new(store)).expect("the keyspace opens")
}

/// Redis's order of a sorted set: by score, then member bytes.
fn model_order(model: &BTreeMap<Vec<u8>, f64>) -> Vec<(Vec<u8>, f64)> {
    let mut all: Vec<(Vec<u8>, f64)> = model.iter().map(|(m, s)| (m.clone(), *s)).collect();
    all.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    all
}

#[test]
fn sorted_set_pops_match_a_model_through_adds_at_both_ends() {
    let db = db();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut model: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
    for step in 0..3000u32 {
        let mut ctx = Ctx::new(&db, 1000);
        match rng.gen_range(0..10) {
            0..=3 => {
                let member = format!("m{}", rng.gen_range(0..400)).into_bytes();
                // Scores anywhere, including below every popped one and
                // -0 (stored as +0).
                let score = match rng.gen_range(0..20) {
                    0 => -0.0,
                    _ => f64::from(rng.gen_range(-200i32..200)),
                };
                zset::add(&mut ctx, b"z", &[(score, &member)], AddFlags::default()).unwrap();
                model.insert(member, if score == 0.0 { 0.0 } else { score });
            }
            n => {
                let max = n % 2 == 0;
                let count = rng.gen_range(1..4u64);
                let got = zset::pop(&mut ctx, b"z", count, max).unwrap();
                let mut order = model_order(&model);
                if max {
                    order.reverse();
                }
                order.truncate(count as usize);
                assert_eq!(got, order, "step {step}");
                for (m, _) in &got {
                    model.remove(m);
                }
            }
        }
    }
}

#[test]
fn set_pops_take_distinct_members_the_set_held_and_leave_the_rest() {
    let db = db();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut ctx = Ctx::new(&db, 1000);
    let members: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("element:{i:06}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = members.iter().map(|m| &m[..]).collect();
    set::add(&mut ctx, b"s", &refs).unwrap();
    model.extend(members.iter().cloned());
    let mut popped_low = 0;
    for step in 0..600u32 {
        let mut ctx = Ctx::new(&db, 1000);
        if step % 50 == 0 {
            let extra = format!("element:{:06}", 5000 + step).into_bytes();
            set::add(&mut ctx, b"s", &[&extra[..]]).unwrap();
            model.insert(extra);
        }
        let count = rng.gen_range(1..5u64);
        let got = set::pop(&mut ctx, b"s", count).unwrap().unwrap();
        assert_eq!(got.len() as u64, count, "step {step}");
        let distinct: BTreeSet<&Vec<u8>> = got.iter().collect();
        assert_eq!(distinct.len(), got.len(), "step {step}: a member twice");
        for m in &got {
            assert!(model.remove(m), "step {step}: {m:?} was not in the set");
            popped_low += usize::from(m < &b"element:001000".to_vec());
        }
    }
    let ctx = Ctx::new(&db, 1000);
    let left: BTreeSet<Vec<u8>> = set::members(&ctx, b"s").unwrap().into_iter().collect();
    assert_eq!(left, model);
    // Picks reach both halves of the members' range (not the first ones
    // over and over).
    assert!(
        (300..1300).contains(&popped_low),
        "{popped_low} of ~1,500 from the lower half"
    );
}

/// A set popped one member at a time until empty: once its pops
/// outnumber its live members it draws from members read near its floor
/// (kept between pops), so members removed meanwhile by SREM and SMOVE,
/// and members added back, must be seen: every pop takes a member the
/// set holds, never one twice, and the set ends empty.
#[test]
fn set_pops_to_empty_see_removals_and_adds_between_them() {
    let db = db();
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut model: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut ctx = Ctx::new(&db, 1000);
    let members: Vec<Vec<u8>> = (0..3000)
        .map(|i| format!("element:{i:06}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = members.iter().map(|m| &m[..]).collect();
    set::add(&mut ctx, b"s", &refs).unwrap();
    model.extend(members.iter().cloned());
    let mut step = 0u32;
    while !model.is_empty() {
        step += 1;
        assert!(step < 10_000, "the set never empties");
        let mut ctx = Ctx::new(&db, 1000);
        match rng.gen_range(0..20) {
            // Removals of members anywhere, the lowest (likeliest to be
            // among those kept for the next pops) most often.
            0..=2 => {
                let victim = if rng.gen_bool(0.7) {
                    model.iter().next().cloned()
                } else {
                    model.iter().nth(rng.gen_range(0..model.len())).cloned()
                };
                let victim = victim.unwrap();
                if rng.gen_bool(0.5) {
                    assert_eq!(set::remove(&mut ctx, b"s", &[&victim[..]]).unwrap(), 1);
                } else {
                    assert!(set::smove(&mut ctx, b"s", b"elsewhere", &victim).unwrap());
                }
                model.remove(&victim);
            }
            3 if step.is_multiple_of(7) => {
                let back = members[rng.gen_range(0..members.len())].clone();
                set::add(&mut ctx, b"s", &[&back[..]]).unwrap();
                model.insert(back);
            }
            _ => {
                let count = if rng.gen_bool(0.9) {
                    1
                } else {
                    rng.gen_range(2..6u64)
                };
                let got = set::pop(&mut ctx, b"s", count).unwrap().unwrap_or_default();
                assert_eq!(got.len(), (count as usize).min(model.len()), "step {step}");
                let distinct: BTreeSet<&Vec<u8>> = got.iter().collect();
                assert_eq!(distinct.len(), got.len(), "step {step}: a member twice");
                for m in &got {
                    assert!(model.remove(m), "step {step}: {m:?} was not in the set");
                }
            }
        }
        let ctx = Ctx::new(&db, 1000);
        if step.is_multiple_of(500) || model.len() < 5 {
            let left: BTreeSet<Vec<u8>> = set::members(&ctx, b"s").unwrap().into_iter().collect();
            assert_eq!(left, model, "step {step}");
        }
    }
    let ctx = Ctx::new(&db, 1000);
    assert!(set::members(&ctx, b"s").unwrap().is_empty());
}
