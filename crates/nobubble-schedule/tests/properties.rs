//! Property tests: random pipelines, random heterogeneous costs and communication. Every
//! generated schedule must validate, and its simulated timeline must obey the rules the
//! simulator claims to implement, checked here independently.

use nobubble_schedule::sim::dependency;
use nobubble_schedule::{
    check_weight_order, generate, simulate, span_lower_bound, CostModel, CostSpec, Kind, RankCost,
    Request, Schedule, ScheduleKind, Simulation,
};
use proptest::prelude::*;
use std::collections::HashMap;

mod common;

/// Random per-rank costs for this file's properties.
fn costs_strategy(p: usize) -> impl Strategy<Value = CostSpec> {
    common::costs_strategy(p, 0.1..5.0, 0.1..5.0, 0.0..1.0, 0.0..2.0)
}

/// Checks the timeline against the rules, without using the simulator's own bookkeeping.
fn check_timeline(s: &Schedule, c: &CostModel, sim: &Simulation) {
    let mut end: HashMap<(usize, usize, usize), f64> = HashMap::new();
    for slots in &sim.timeline {
        for sl in slots {
            let a = sl.action;
            let slot = match a.kind {
                Kind::F => 0,
                Kind::I | Kind::B => 1,
                Kind::W => 2,
            };
            end.insert((a.stage, slot, a.microbatch), sl.end);
        }
    }
    for (r, slots) in sim.timeline.iter().enumerate() {
        assert_eq!(slots.len(), s.orders[r].len());
        let mut prev_end = 0.0;
        for (k, sl) in slots.iter().enumerate() {
            let a = sl.action;
            assert_eq!(a, s.orders[r][k], "timeline keeps program order");
            assert!(
                sl.start >= prev_end - 1e-9,
                "rank {r}: {a} overlaps the previous action"
            );
            assert!((sl.end - sl.start - c.time(a.stage, a.kind)).abs() < 1e-9);
            if let Some(d) = dependency(a, s.stages) {
                let slot = if d.kind == Kind::F { 0 } else { 1 };
                let hop = if s.placement[d.stage] != r {
                    c.comm
                } else {
                    0.0
                };
                let ready = end[&(d.stage, slot, d.microbatch)] + hop;
                assert!(
                    sl.start >= ready - 1e-9,
                    "{a} starts before {d} is available"
                );
            }
            prev_end = sl.end;
        }
    }
}

/// A simple lower bound: the busiest rank's work, and one microbatch's trip down and back.
fn lower_bound(s: &Schedule, c: &CostModel) -> f64 {
    let m = s.microbatches as f64;
    let busiest = (0..s.ranks)
        .map(|r| m * c.work_per_microbatch(s, r))
        .fold(0.0, f64::max);
    let crossings = (1..s.stages)
        .filter(|&k| s.placement[k] != s.placement[k - 1])
        .count();
    let trip: f64 =
        c.stages.iter().map(|x| x.f + x.i).sum::<f64>() + 2.0 * crossings as f64 * c.comm;
    busiest.max(trip)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn every_generated_schedule_is_valid_and_respected(
        (p, m, spec) in (1usize..=16, 1usize..=64).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        v in 2usize..=3,
    ) {
        for kind in ScheduleKind::ALL.into_iter().filter(|k| !k.uses_costs()) {
            let req = Request { chunks: v, ..Request::new(kind, p, m) };
            let s = match generate(&req, &spec) {
                Ok(s) => s,
                Err(e) => {
                    // The only refusals: interleaving with m not a multiple of p, and
                    // DualPipeV with fewer than 2p microbatches.
                    let interleaved = matches!(kind, ScheduleKind::Interleaved1F1B | ScheduleKind::InterleavedZb);
                    if interleaved {
                        prop_assert!(m % p != 0 && e.to_string().contains("multiple"), "{}: {e}", kind.name());
                    } else {
                        prop_assert!(kind == ScheduleKind::DualPipeV && m < 2 * p, "{}: {e}", kind.name());
                    }
                    continue;
                }
            };
            check_weight_order(&s).unwrap_or_else(|e| panic!("{} p={p} m={m}: {e}", kind.name()));
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            let sim = simulate(&s, &c).unwrap_or_else(|e| panic!("{} p={p} m={m}: {e}", kind.name()));
            check_timeline(&s, &c, &sim);
            let lb = lower_bound(&s, &c);
            prop_assert!(sim.metrics.makespan >= lb - 1e-9, "{}: makespan {} < bound {lb}", kind.name(), sim.metrics.makespan);
            let span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
            let slb = span_lower_bound(&s.placement, m, &c, None);
            prop_assert!(span >= slb * (1.0 - 1e-12), "{}: span {span} < span bound {slb}", kind.name());
            for r in 0..s.ranks {
                let work = m as f64 * c.work_per_microbatch(&s, r);
                prop_assert!((sim.metrics.busy[r] - work).abs() < 1e-6 * work.max(1.0));
            }
            prop_assert!(sim.metrics.bubble_rate >= 0.0 && sim.metrics.bubble_rate < 1.0);
            prop_assert!(sim.metrics.bubble_fraction >= sim.metrics.bubble_rate - 1e-9);
            // The critical path starts at time 0 and ends at the makespan.
            let cp = &sim.critical_path;
            prop_assert!(!cp.is_empty());
            let last = sim.timeline.iter().flatten().find(|sl| sl.action == *cp.last().unwrap()).unwrap();
            prop_assert!((last.end - sim.metrics.makespan).abs() < 1e-9);
            let first = sim.timeline.iter().flatten().find(|sl| sl.action == cp[0]).unwrap();
            prop_assert!(first.start.abs() < 1e-9);
        }
    }

    #[test]
    fn generators_are_deterministic(p in 1usize..=8, m in 1usize..=24) {
        for kind in ScheduleKind::ALL {
            let req = Request::new(kind, p, m);
            let spec = CostSpec::uniform(RankCost::default(), 0.5);
            match (generate(&req, &spec), generate(&req, &spec)) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                _ => prop_assert!(false, "one run failed, the other did not"),
            }
        }
    }
}
