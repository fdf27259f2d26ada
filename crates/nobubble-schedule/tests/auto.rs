//! Property tests for the automatic schedulers: valid, within their memory limit, never
//! below the proven lower bound, never worse than the handcrafted schedules they replace,
//! and never worse with more memory.

use nobubble_schedule::{
    check_memory, check_weight_order, generate, lower_bound, simulate, span_lower_bound, CostModel,
    CostSpec, MemLimit, RankCost, Request, Schedule, ScheduleKind,
};
use proptest::prelude::*;

mod common;

/// Random per-rank costs for this file's properties.
fn costs_strategy(p: usize) -> impl Strategy<Value = CostSpec> {
    common::costs_strategy(p, 0.5..3.0, 0.3..2.0, 0.1..0.9, 0.0..0.5)
}

fn plan(kind: ScheduleKind, p: usize, m: usize, spec: &CostSpec, x: Option<f64>) -> Schedule {
    let req = Request {
        mem_limit: x.map_or(MemLimit::None, MemLimit::Multiple),
        ..Request::new(kind, p, m)
    };
    generate(&req, spec).unwrap_or_else(|e| panic!("{} p={p} m={m} x={x:?}: {e}", kind.name()))
}

/// The paper's grid costs (F/I/W 1/1.2/0.8, M_W = M_B / 2) with link latency `comm`.
fn grid_costs(comm: f64) -> CostSpec {
    CostSpec::uniform(
        RankCost {
            f: 1.0,
            i: 1.2,
            w: 0.8,
            mem_b: 1.0,
            mem_w: 0.5,
            b: None,
        },
        comm,
    )
}

/// (longest rank span, makespan), the planner's objective.
fn score(s: &Schedule, spec: &CostSpec) -> (f64, f64) {
    let c = CostModel::for_schedule(spec, s).unwrap();
    let sim = simulate(s, &c).unwrap();
    (
        sim.metrics.span.iter().copied().fold(0.0, f64::max),
        sim.metrics.makespan,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn auto_schedules_are_valid_fit_and_respect_the_bound(
        (p, m, spec) in (1usize..=6, 1usize..=16).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        frac in 0.0f64..1.0,
    ) {
        for (kind, max_x) in [(ScheduleKind::ZbAuto, 2 * p + 1), (ScheduleKind::VAuto, p + 1), (ScheduleKind::VHalf, p + 1)] {
            let asked = 1.0 + frac * (max_x as f64 - 1.0);
            // v-half plans under its own limit (⌊(p+2)/2⌋); the others under the one asked for.
            let x = kind.planning_limit(p, Some(asked)).unwrap();
            let s = plan(kind, p, m, &spec, Some(asked));
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            let sim = simulate(&s, &c).unwrap();
            check_memory(&s, &c, x).unwrap();
            check_weight_order(&s).unwrap();
            let lb = lower_bound(&s.placement, m, &c, Some(x));
            prop_assert!(sim.metrics.makespan >= lb - 1e-9, "{} makespan {} < bound {lb}", kind.name(), sim.metrics.makespan);
            let span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
            let slb = span_lower_bound(&s.placement, m, &c, Some(x));
            prop_assert!(span >= slb * (1.0 - 1e-12), "{} span {span} < span bound {slb}", kind.name());
        }
    }

    #[test]
    fn zb_auto_is_never_worse_than_the_handcrafted_schedules(
        (p, m, spec) in (1usize..=6, 1usize..=16).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
    ) {
        let h1 = score(&plan(ScheduleKind::ZbH1, p, m, &spec, None), &spec);
        let a1 = score(&plan(ScheduleKind::ZbAuto, p, m, &spec, Some(p as f64)), &spec);
        prop_assert!(a1.0 <= h1.0 + 1e-9, "zb-auto at p: {a1:?} vs zb-h1 {h1:?}");
        let h2_sched = plan(ScheduleKind::ZbH2, p, m, &spec, None);
        let h2 = score(&h2_sched, &spec);
        let c = CostModel::for_schedule(&spec, &h2_sched).unwrap();
        let h2_peak = simulate(&h2_sched, &c).unwrap().metrics.peak_memory.iter().copied().fold(0.0, f64::max);
        let x = h2_peak.max((2 * p - 1) as f64);
        let a2 = score(&plan(ScheduleKind::ZbAuto, p, m, &spec, Some(x)), &spec);
        prop_assert!(a2.0 <= h2.0 + 1e-9, "zb-auto at {x}: {a2:?} vs zb-h2 {h2:?}");
    }

    #[test]
    fn zb_auto_is_never_worse_than_the_papers_scheduler(
        (p, m, spec) in (1usize..=6, 1usize..=16).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        frac in 0.0f64..1.0,
    ) {
        // Any limit from p (below it the paper's warm-up cannot start) to 2p + 1.
        let x = p as f64 + frac * (p + 1) as f64;
        let req = Request { mem_limit: MemLimit::Multiple(x), ..Request::new(ScheduleKind::ZbPaper, p, m) };
        if let Ok(paper) = generate(&req, &spec) {
            let theirs = score(&paper, &spec);
            let ours = score(&plan(ScheduleKind::ZbAuto, p, m, &spec, Some(x)), &spec);
            prop_assert!(ours.0 <= theirs.0 + 1e-9, "p={p} m={m} x={x}: zb-auto {ours:?} vs the paper's {theirs:?}");
        }
    }

    #[test]
    fn more_memory_never_gives_a_worse_schedule(
        (p, m, spec) in (1usize..=5, 1usize..=12).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
    ) {
        for kind in [ScheduleKind::ZbAuto, ScheduleKind::VAuto] {
            let mut prev = f64::INFINITY;
            for x in 1..=(2 * p + 1) {
                let sc = score(&plan(kind, p, m, &spec, Some(x as f64)), &spec);
                prop_assert!(sc.0 <= prev + 1e-9, "{} p={p} m={m}: span {} at limit {x} > {prev} at {}", kind.name(), sc.0, x - 1);
                prev = sc.0;
            }
        }
    }
}

#[test]
fn a_limit_below_one_microbatch_is_refused_with_the_minimum() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for kind in [ScheduleKind::ZbAuto, ScheduleKind::VAuto] {
        let req = Request {
            mem_limit: MemLimit::Multiple(0.5),
            ..Request::new(kind, 4, 8)
        };
        let e = generate(&req, &spec).unwrap_err().to_string();
        assert!(e.contains("minimum feasible 1"), "{e}");
    }
}

#[test]
fn two_p_and_zb_v_reach_near_zero_bubble_when_passes_are_equal() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for p in [2usize, 4, 8] {
        for m in [2 * p, 3 * p, 4 * p] {
            for kind in [ScheduleKind::Zb2p, ScheduleKind::ZbV] {
                let s = plan(kind, p, m, &spec, None);
                let c = CostModel::for_schedule(&spec, &s).unwrap();
                let rate = simulate(&s, &c).unwrap().metrics.bubble_rate;
                assert!(
                    rate <= 0.005,
                    "{} p={p} m={m}: bubble rate {rate}",
                    kind.name()
                );
            }
        }
    }
}

/// V-Min and V-Half with F = I = W (Qi et al., "Pipeline Parallelism with Controllable
/// Memory"): within ⌊(p+4)/3⌋ and ⌊(p+2)/2⌋ microbatches' activations, V-Min's bubble rate is
/// about 2p/3m and has no steady-state part (its idle time does not grow with m); V-Half
/// never does worse than V-Min, and both beat 1F1B.
#[test]
fn v_min_and_v_half_reach_the_building_blocks_figures() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let measure = |kind: ScheduleKind, p: usize, m: usize| {
        let s = plan(kind, p, m, &spec, None);
        let c = CostModel::for_schedule(&spec, &s).unwrap();
        let sim = simulate(&s, &c).unwrap();
        let peak = sim.metrics.peak_memory.iter().copied().fold(0.0, f64::max);
        let idle = sim.metrics.span.iter().copied().fold(0.0, f64::max)
            - sim.metrics.busy.iter().copied().fold(0.0, f64::max);
        (sim.metrics.bubble_rate, peak, idle)
    };
    for p in [2usize, 3, 4, 5, 8, 16] {
        let mut idle_by_m = Vec::new();
        for m in [2 * p, 4 * p, 8 * p] {
            let (min_rate, min_peak, min_idle) = measure(ScheduleKind::VMin, p, m);
            let (half_rate, half_peak, _) = measure(ScheduleKind::VHalf, p, m);
            let (one_rate, _, _) = measure(ScheduleKind::OneFOneB, p, m);
            let ctx = format!("p={p} m={m}");
            assert!(
                min_peak <= ((p + 4) / 3) as f64 + 1e-9,
                "{ctx}: v-min peak {min_peak}"
            );
            assert!(
                half_peak <= ((p + 2) / 2) as f64 + 1e-9,
                "{ctx}: v-half peak {half_peak}"
            );
            assert!(
                min_rate <= 2.0 * p as f64 / (3.0 * m as f64) + 1e-9,
                "{ctx}: v-min {min_rate}"
            );
            assert!(
                half_rate <= min_rate + 1e-9,
                "{ctx}: v-half {half_rate} > v-min {min_rate}"
            );
            assert!(
                min_rate < one_rate,
                "{ctx}: v-min {min_rate} ≥ 1f1b {one_rate}"
            );
            idle_by_m.push(min_idle);
        }
        assert!(
            idle_by_m.iter().all(|&i| (i - idle_by_m[0]).abs() < 1e-9),
            "p={p}: v-min idle time grows with m: {idle_by_m:?}"
        );
    }
}

/// On small pipelines the exact branch and bound proves the optimum; `zb-auto` (given all
/// the memory it wants) must be within 2% of it, and the lower bound never above it.
#[test]
fn zb_auto_is_near_optimal_on_small_instances() {
    use nobubble_schedule::exact::min_makespan;
    let mut proven = 0;
    let mut worst_gap: f64 = 0.0;
    for (p, m) in [(2usize, 2usize), (2, 4), (3, 3), (3, 4), (4, 4)] {
        for (f, i, w, c) in [
            (1.0, 1.0, 1.0, 0.0),
            (1.0, 1.3, 0.6, 0.2),
            (1.0, 1.5, 0.5, 0.0),
            (2.0, 1.0, 1.5, 0.5),
        ] {
            let spec = CostSpec::uniform(
                RankCost {
                    f,
                    i,
                    w,
                    mem_b: 1.0,
                    mem_w: 0.5,
                    b: None,
                },
                c,
            );
            // The exact search knows the linear placement only.
            let req = Request {
                mem_limit: MemLimit::Multiple(m as f64),
                placement: Some(nobubble_schedule::Placement::Linear),
                ..Request::new(ScheduleKind::ZbAuto, p, m)
            };
            let s = generate(&req, &spec).unwrap();
            let costs = CostModel::for_schedule(&spec, &s).unwrap();
            let auto = simulate(&s, &costs).unwrap().metrics.makespan;
            // Search from a loose incumbent so the optimum is found, not just confirmed.
            let e = min_makespan(&s.placement, m, &costs, None, auto * 1.5, 2_000_000);
            if !e.proven {
                continue;
            }
            proven += 1;
            let lb = lower_bound(&s.placement, m, &costs, None);
            assert!(
                lb <= e.makespan + 1e-9,
                "bound {lb} above optimum {}",
                e.makespan
            );
            let gap = auto / e.makespan - 1.0;
            worst_gap = worst_gap.max(gap);
            assert!(
                gap <= 0.02,
                "p={p} m={m} costs {f},{i},{w} comm {c}: zb-auto {auto} vs optimum {}",
                e.makespan
            );
            // The exact schedule is itself valid under the simulator.
            let ex = e.better.expect("a 1.5× incumbent is always beaten");
            let sim = simulate(&ex, &costs).unwrap();
            assert!((sim.metrics.makespan - e.makespan).abs() < 1e-9);
        }
    }
    assert!(proven >= 15, "only {proven} instances proven optimal");
    println!("{proven} instances proven; zb-auto worst gap to the optimum: {worst_gap:.4}");
}

/// Large pipelines below the handcrafted schedules' memory (limits under p) still get a
/// schedule that fits.
#[test]
fn zb_auto_plans_below_p_on_large_pipelines() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for (p, m, x) in [(8usize, 63usize, 7.0), (16, 32, 8.0), (16, 32, 1.0)] {
        let s = plan(ScheduleKind::ZbAuto, p, m, &spec, Some(x));
        let c = CostModel::for_schedule(&spec, &s).unwrap();
        check_memory(&s, &c, x).unwrap();
        simulate(&s, &c).unwrap();
    }
}

/// The longest rank span of `s` under `spec` against `reference`'s, both simulated by our
/// simulator (which times the official schedules as the official code does).
fn spans(s: &Schedule, reference: &Schedule, spec: &CostSpec) -> (f64, f64) {
    (score(s, spec).0, score(reference, spec).0)
}

#[test]
fn zb_2p_matches_the_official_schedule_of_the_28b_pipeline() {
    // ../shared/data/reference-schedules: the authors' own scheduler's ZB-2p for the 28.3B
    // row (p 32, m 96), at the limit 64 × M_B it was made for.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/reference-schedules/arxivV07_28.3B-V_p32_m96_ZB-2p.csv"
    );
    let text = std::fs::read_to_string(path).expect("the shared reference schedules");
    let reference = nobubble_schedule::export::csv::read(&text, "official").unwrap();
    let spec = CostSpec::uniform(
        RankCost {
            f: 18916.0,
            i: 19496.0,
            w: 14576.0,
            mem_b: 454656.0,
            mem_w: 196608.0,
            b: None,
        },
        879.0,
    );
    let costs = CostModel::for_schedule(&spec, &reference).unwrap();
    check_memory(&reference, &costs, 64.0).unwrap();
    for kind in [
        ScheduleKind::Zb2p,
        ScheduleKind::ZbPaper,
        ScheduleKind::ZbAuto,
    ] {
        let x = (kind != ScheduleKind::Zb2p).then_some(64.0);
        let ours = plan(kind, 32, 96, &spec, x);
        let (a, b) = spans(&ours, &reference, &spec);
        assert!(
            a <= b * (1.0 + 1e-9),
            "{}: span {a} vs the official {b}",
            kind.name()
        );
    }
}

#[test]
fn the_paper_scheduler_at_one_and_a_half_p_finds_the_official_schedule() {
    // p 16, m 32, F, I, W = 1, 1.2, 0.8, limit 24 = 1.5p: the official greedy reaches a
    // 9.60% bubble rate (its budget mode); the knobs of the description alone gave 12.6%.
    let spec = grid_costs(0.0);
    // The official greedy's figures at other limits (its own code, re-run; see
    // docs/notes/official-schedulers.md): ours must be at or below each.
    for (x, official) in [
        (18.0, 0.1474),
        (20.0, 0.1273),
        (22.0, 0.1111),
        (24.0, 0.0960),
        (26.0, 0.0840),
        (28.0, 0.0822),
        (30.0, 0.0805),
    ] {
        for kind in [ScheduleKind::ZbPaper, ScheduleKind::ZbAuto] {
            let s = plan(kind, 16, 32, &spec, Some(x));
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            check_memory(&s, &c, x).unwrap();
            let rate = simulate(&s, &c).unwrap().metrics.bubble_rate;
            assert!(rate <= official + 5e-5, "{} at {x}: {rate}", kind.name());
        }
    }
}

#[test]
fn v_schedules_match_or_beat_the_official_ones_at_their_limits() {
    // ../shared/data/reference-schedules: the authors' ZB-V (a cost-aware greedy), V-Half
    // and V-Min (building blocks squeezed to their memory) for the 1.5B row, p 8, m 24.
    let spec = CostSpec::uniform(
        RankCost {
            f: 18522.0,
            i: 18086.0,
            w: 9337.0,
            mem_b: 201216.0,
            mem_w: 73728.0,
            b: None,
        },
        601.0,
    );
    for (file, kind, limit) in [
        ("paper01_1.5B_p8_m24_ZB-V.csv", ScheduleKind::ZbV, 8.0),
        ("paper01_1.5B_p8_m24_V-Half.csv", ScheduleKind::VHalf, 5.0),
        ("paper01_1.5B_p8_m24_V-Min.csv", ScheduleKind::VMin, 4.0),
    ] {
        let path = format!(
            "{}/../../../shared/data/reference-schedules/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("the shared reference schedules");
        let reference = nobubble_schedule::export::csv::read(&text, "official").unwrap();
        let costs = CostModel::for_schedule(&spec, &reference).unwrap();
        check_memory(&reference, &costs, limit).unwrap();
        let theirs = simulate(&reference, &costs).unwrap().metrics;
        for (k, x) in [(kind, None), (ScheduleKind::VAuto, Some(limit))] {
            let ours = plan(k, 8, 24, &spec, x);
            check_memory(&ours, &costs, limit).unwrap();
            let m = simulate(&ours, &costs).unwrap().metrics;
            let (a, b) = spans(&ours, &reference, &spec);
            assert!(
                a <= b * (1.0 + 1e-9)
                    && m.makespan <= theirs.makespan * (1.0 + 1e-9)
                    && m.bubble_rate <= theirs.bubble_rate + 1e-9,
                "{} at {limit}: span {a} vs {b}, makespan {} vs {}, bubble {} vs {}",
                k.name(),
                m.makespan,
                theirs.makespan,
                m.bubble_rate,
                theirs.bubble_rate
            );
        }
    }
}

/// The V planners over every small shape at their own limits and below: valid, within the
/// limit, and never worse than the fixed ZB-V pattern where it fits.
#[test]
fn v_planners_are_valid_on_every_small_shape() {
    let spec = CostSpec::uniform(
        RankCost {
            f: 1.0,
            i: 1.3,
            w: 0.7,
            mem_b: 1.0,
            mem_w: 0.4,
            b: None,
        },
        0.2,
    );
    for p in 1..=12 {
        for m in [1, 2, 3, p, p + 1, 2 * p, 3 * p + 1] {
            for kind in [ScheduleKind::ZbV, ScheduleKind::VHalf, ScheduleKind::VMin] {
                let s = plan(kind, p, m, &spec, None);
                let c = CostModel::for_schedule(&spec, &s).unwrap();
                let x = kind.planning_limit(p, None).unwrap().min(m as f64);
                check_memory(&s, &c, x)
                    .unwrap_or_else(|e| panic!("{} p={p} m={m}: {e}", kind.name()));
                simulate(&s, &c).unwrap();
                let pattern = nobubble_schedule::generate::zb_v_pattern(p, m).unwrap();
                if check_memory(&pattern, &c, x).is_ok() {
                    let (a, b) = (score(&s, &spec), score(&pattern, &spec));
                    assert!(
                        a.0 <= b.0 * (1.0 + 1e-9),
                        "{} p={p} m={m}: {a:?} vs pattern {b:?}",
                        kind.name()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// zb-auto takes the better of its linear and V plans under the objective asked for,
    /// and under the makespan objective it is never slower than the handcrafted linear
    /// schedules that fit.
    #[test]
    fn zb_auto_picks_the_better_placement_for_the_objective(
        (p, m, spec) in (2usize..=6, 2usize..=16).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        extra in 0.0f64..4.0,
    ) {
        use nobubble_schedule::{Objective, Placement};
        let x = p as f64 + extra;
        for objective in [Objective::Span, Objective::Makespan] {
            let run = |placement| {
                let req = Request { mem_limit: MemLimit::Multiple(x), objective, placement, ..Request::new(ScheduleKind::ZbAuto, p, m) };
                generate(&req, &spec).unwrap()
            };
            let ranked = |s: &Schedule| {
                let (span, makespan) = score(s, &spec);
                if objective == Objective::Span { (span, makespan) } else { (makespan, span) }
            };
            let (auto, linear, v) = (run(None), run(Some(Placement::Linear)), run(Some(Placement::V)));
            let c = CostModel::for_schedule(&spec, &auto).unwrap();
            check_memory(&auto, &c, x).unwrap();
            let (a, l, vv) = (ranked(&auto), ranked(&linear), ranked(&v));
            let not_worse = |a: (f64, f64), b: (f64, f64)| a.0 <= b.0 * (1.0 + 1e-9) + 1e-12;
            prop_assert!(not_worse(a, l) && not_worse(a, vv), "{objective:?}: auto {a:?}, linear {l:?}, v {vv:?}");
            if objective == Objective::Makespan {
                for h in [nobubble_schedule::generate::zb_h1(p, m).unwrap(), nobubble_schedule::generate::zb_h2(p, m).unwrap()] {
                    let hc = CostModel::for_schedule(&spec, &h).unwrap();
                    if check_memory(&h, &hc, x).is_ok() {
                        prop_assert!(a.0 <= score(&h, &spec).1 * (1.0 + 1e-9), "makespan {} vs {} {}", a.0, h.name, score(&h, &spec).1);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Byte budgets per rank: zb-auto plans every rank within its own budget, and never
    /// worse than under the tightest rank's multiple shared by all, nor than ZB-H1 when it
    /// fits the budgets.
    #[test]
    fn per_rank_budgets_are_planned_per_rank(
        (p, m, spec) in (2usize..=6, 2usize..=16).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        room in proptest::collection::vec(1.0f64..8.0, 6),
    ) {
        use nobubble_schedule::validate::check_memory_budget;
        use nobubble_schedule::Placement;
        let linear = CostModel::for_layout(&spec, p, p).unwrap();
        // Budgets of 1 to 8 microbatches' activations, rank by rank.
        let budget: Vec<f64> = (0..p).map(|r| room[r] * linear.stages[r].mem_b).collect();
        let tight = (0..p).map(|r| budget[r] / linear.stages[r].mem_b).fold(f64::INFINITY, f64::min);
        let run = |mem_limit: MemLimit| {
            let req = Request { mem_limit, placement: Some(Placement::Linear), ..Request::new(ScheduleKind::ZbAuto, p, m) };
            generate(&req, &spec).unwrap()
        };
        let own = run(MemLimit::PerRank(budget.clone()));
        let c = CostModel::for_schedule(&spec, &own).unwrap();
        check_memory_budget(&own, &c, &budget).unwrap();
        let shared = run(MemLimit::Multiple(tight));
        let (a, b) = (score(&own, &spec), score(&shared, &spec));
        prop_assert!(a.0 <= b.0 * (1.0 + 1e-9), "budgets {a:?} vs shared multiple {b:?}");
        let h1 = nobubble_schedule::generate::zb_h1(p, m).unwrap();
        if check_memory_budget(&h1, &c, &budget).is_ok() {
            prop_assert!(a.0 <= score(&h1, &spec).0 * (1.0 + 1e-9));
        }
        // zb-auto's own placement choice also stays within the budgets.
        let req = Request { mem_limit: MemLimit::PerRank(budget.clone()), ..Request::new(ScheduleKind::ZbAuto, p, m) };
        if let Ok(s) = generate(&req, &spec) {
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            check_memory_budget(&s, &c, &budget).unwrap();
        }
    }
}

#[test]
fn budgets_below_one_microbatch_or_of_the_wrong_count_are_refused() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let req = |b: Vec<f64>| Request {
        mem_limit: MemLimit::PerRank(b),
        ..Request::new(ScheduleKind::ZbAuto, 4, 8)
    };
    let e = generate(&req(vec![4.0, 4.0, 0.5, 4.0]), &spec)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 2") && e.contains("below one microbatch"),
        "{e}"
    );
    let e = generate(&req(vec![4.0, 4.0]), &spec)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 budgets for 4 ranks"), "{e}");
    let e = generate(&req(vec![-1.0]), &spec).unwrap_err().to_string();
    assert!(e.contains("not a positive size"), "{e}");
}

/// Above the ladder's size the planner works at the limit only: still within it, and never
/// worse than the paper's greedy or the handcrafted schedules that fit.
#[test]
fn large_pipelines_plan_at_the_limit_and_stay_ahead_of_the_baselines() {
    let spec = grid_costs(0.1);
    let (p, m) = (24usize, 300usize);
    assert!(3 * p * m > nobubble_schedule::generate::auto::LADDER_MAX_ACTIONS);
    for x in [12.0, 24.0, 36.0, 48.0] {
        let ours = plan(ScheduleKind::ZbAuto, p, m, &spec, Some(x));
        let c = CostModel::for_schedule(&spec, &ours).unwrap();
        check_memory(&ours, &c, x).unwrap();
        let paper = plan(ScheduleKind::ZbPaper, p, m, &spec, Some(x));
        assert!(
            score(&ours, &spec).0 <= score(&paper, &spec).0 * (1.0 + 1e-9),
            "limit {x}"
        );
        for h in [
            nobubble_schedule::generate::zb_h1(p, m).unwrap(),
            nobubble_schedule::generate::zb_h2(p, m).unwrap(),
        ] {
            let hc = CostModel::for_schedule(&spec, &h).unwrap();
            if check_memory(&h, &hc, x).is_ok() {
                assert!(
                    score(&ours, &spec).0 <= score(&h, &spec).0 * (1.0 + 1e-9),
                    "limit {x}: {}",
                    h.name
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// The planned layer split is never worse than the even one under the objective, covers
    /// every block, and keeps a block on every middle stage.
    #[test]
    fn the_planned_split_is_never_worse_than_the_even_one(
        p in 2usize..=4,
        extra in 0usize..=6,
        head in 0.1f64..4.0,
        times in proptest::collection::vec(0.3f64..2.0, 14),
        makespan in any::<bool>(),
    ) {
        use nobubble_schedule::split::{even_counts, plan_split, LayerCosts};
        use nobubble_schedule::Objective;
        let blocks = 2 * p + extra;
        let c = |f: f64| RankCost { f, i: 1.1 * f, w: 0.8 * f, mem_b: 1.0, mem_w: 0.4, b: None };
        let layers = LayerCosts {
            comm: 0.05,
            embedding: c(0.05),
            blocks: times[..blocks].iter().map(|&f| c(f)).collect(),
            block: None,
            count: 0,
            head: c(head),
        };
        let objective = if makespan { Objective::Makespan } else { Objective::Span };
        let req = Request { objective, ..Request::new(ScheduleKind::ZbAuto, p, 2 * p) };
        let s = plan_split(&req, &layers).unwrap();
        let n = s.schedule.stages;
        prop_assert_eq!(s.counts.iter().sum::<usize>(), blocks);
        prop_assert!(s.counts[1..n - 1].iter().all(|&k| k >= 1));
        let ranked = |sch: &Schedule, spec: &CostSpec| {
            let (span, mk) = score(sch, spec);
            if makespan { (mk, span) } else { (span, mk) }
        };
        let even_spec = layers.spec(&even_counts(blocks, s.even.as_ref().unwrap().stages)).unwrap();
        let (a, b) = (ranked(&s.schedule, &s.spec), ranked(s.even.as_ref().unwrap(), &even_spec));
        prop_assert!(a.0 <= b.0 * (1.0 + 1e-9), "split {:?}: {a:?} vs even {b:?}", s.counts);
    }
}

/// Under a memory limit the exact enumeration proves the optimum on tiny pipelines: it
/// agrees with the unlimited exact search when memory does not bind, its optimum fits the
/// limit and never beats the memory-aware lower bound, and zb-auto (for the makespan, on the
/// linear placement) stays within a few per cent of it at every limit.
#[test]
fn zb_auto_is_near_the_exact_optimum_under_memory_limits() {
    use nobubble_schedule::exact::min_makespan;
    use nobubble_schedule::{Objective, Placement};
    let mut proven = 0;
    let mut worst: f64 = 0.0;
    for (p, m) in [(2usize, 2usize), (2, 3), (2, 4), (3, 3), (3, 4)] {
        for (f, i, w, c) in [
            (1.0, 1.0, 1.0, 0.0),
            (1.0, 1.3, 0.6, 0.2),
            (2.0, 1.0, 1.5, 0.5),
        ] {
            let spec = CostSpec::uniform(
                RankCost {
                    f,
                    i,
                    w,
                    mem_b: 1.0,
                    mem_w: 0.5,
                    b: None,
                },
                c,
            );
            for x in 1..=p {
                let x = x as f64;
                let req = Request {
                    mem_limit: MemLimit::Multiple(x),
                    objective: Objective::Makespan,
                    placement: Some(Placement::Linear),
                    ..Request::new(ScheduleKind::ZbAuto, p, m)
                };
                let s = generate(&req, &spec).unwrap();
                let costs = CostModel::for_schedule(&spec, &s).unwrap();
                let ours = simulate(&s, &costs).unwrap().metrics.makespan;
                let e = min_makespan(&s.placement, m, &costs, Some(x), ours * 1.5, 3_000_000);
                if !e.proven {
                    continue;
                }
                proven += 1;
                // Searched from a loose incumbent, the optimum is found, not just confirmed.
                assert!(
                    e.better.is_some(),
                    "p={p} m={m} limit {x}: nothing below 1.5× ours"
                );
                if let Some(b) = &e.better {
                    check_memory(b, &costs, x).unwrap();
                    let sim = simulate(b, &costs).unwrap();
                    assert!((sim.metrics.makespan - e.makespan).abs() < 1e-9);
                }
                let lb = lower_bound(&s.placement, m, &costs, Some(x));
                assert!(
                    lb <= e.makespan + 1e-9,
                    "bound {lb} above optimum {}",
                    e.makespan
                );
                let gap = ours / e.makespan - 1.0;
                worst = worst.max(gap);
                assert!(
                    gap <= 0.05,
                    "p={p} m={m} {f},{i},{w} comm {c} limit {x}: {ours} vs {}",
                    e.makespan
                );
                if x >= m as f64 {
                    let free = min_makespan(&s.placement, m, &costs, None, ours * 1.5, 3_000_000);
                    if free.proven {
                        assert!(
                            (free.makespan - e.makespan).abs() < 1e-9,
                            "{} vs {}",
                            free.makespan,
                            e.makespan
                        );
                    }
                }
            }
        }
    }
    assert!(proven >= 20, "only {proven} instances proven");
    println!("{proven} limited instances proven; zb-auto worst gap {worst:.4}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// With uneven memory per rank too, zb-auto (choosing its placement at the linear
    /// layout's bytes) never plans worse with more memory, and fits every limit.
    #[test]
    fn more_memory_never_plans_worse_with_uneven_memory(
        (p, m, spec) in (2usize..=5, 2usize..=12).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        mem in proptest::collection::vec(0.5f64..2.0, 5),
    ) {
        let mut spec = spec;
        for (c, &b) in spec.stages.iter_mut().zip(&mem) {
            c.mem_w *= b;
            c.mem_b = b;
        }
        let mut prev = f64::INFINITY;
        for x in 1..=(2 * p + 1) {
            let x = x as f64;
            let s = plan(ScheduleKind::ZbAuto, p, m, &spec, Some(x));
            // Within x × each rank's linear M_B, whichever placement won.
            let linear = CostModel::for_layout(&spec, p, p).unwrap();
            let budget: Vec<f64> = (0..p).map(|r| x * linear.stages[r].mem_b).collect();
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            nobubble_schedule::validate::check_memory_budget(&s, &c, &budget).unwrap();
            let sc = score(&s, &spec);
            prop_assert!(sc.0 <= prev + 1e-9, "p={p} m={m}: span {} at limit {x} > {prev}", sc.0);
            prev = sc.0;
        }
    }
}

/// Over a grid of shapes and costs, `zb-v`, `v-half` and `v-min` are never worse than the
/// authors' constructions (reimplemented: `generate::official_v`), which fit the family's
/// memory whenever stage memory is even.
#[test]
fn v_schedules_are_never_worse_than_the_official_constructions_on_a_grid() {
    for (f, i, w, c) in [(1.0, 1.3, 0.6, 0.2), (18522.0, 18086.0, 9337.0, 601.0)] {
        let spec = CostSpec::uniform(
            RankCost {
                f,
                i,
                w,
                mem_b: 1.0,
                mem_w: 0.4,
                b: None,
            },
            c,
        );
        for kind in [ScheduleKind::ZbV, ScheduleKind::VHalf, ScheduleKind::VMin] {
            for p in [2usize, 3, 4, 5, 6, 8] {
                for m in [p, 2 * p, 3 * p + 1] {
                    let x = kind.planning_limit(p, None).unwrap().min(m as f64);
                    let theirs =
                        nobubble_schedule::generate::official_v(kind, p, m, &spec).unwrap();
                    let tc = CostModel::for_schedule(&spec, &theirs).unwrap();
                    check_memory(&theirs, &tc, x).unwrap_or_else(|e| {
                        panic!("{} p={p} m={m}: official over the limit: {e}", kind.name())
                    });
                    let ours = plan(kind, p, m, &spec, None);
                    let (a, b) = (score(&ours, &spec), score(&theirs, &spec));
                    assert!(
                        a.0 <= b.0 * (1.0 + 1e-9),
                        "{} p={p} m={m} costs {f},{i},{w},{c}: span {} vs {}",
                        kind.name(),
                        a.0,
                        b.0
                    );
                }
            }
        }
    }
}

/// With few microbatches (m ≤ p) the V-Half building block's cool-down begins before its
/// steady phase would: draining from the last microbatch's first forward is what closes the
/// published grid's worst V-Half shape (p 16, m 16, F/I/W 1/1.2/0.8, comm 0.05), where the
/// authors' scheduler reached a makespan of 82.9 and ours 84.0 before.
#[test]
fn v_half_drains_early_with_few_microbatches() {
    let spec = grid_costs(0.05);
    let ours = plan(ScheduleKind::VHalf, 16, 16, &spec, None);
    let c = CostModel::for_schedule(&spec, &ours).unwrap();
    check_memory(&ours, &c, 9.0).unwrap();
    let makespan = simulate(&ours, &c).unwrap().metrics.makespan;
    assert!(makespan <= 82.9, "v-half p 16 m 16: {makespan}");
    // The authors' construction as reimplemented keeps the steady slots: 84.0 here.
    let theirs =
        nobubble_schedule::generate::official_v(ScheduleKind::VHalf, 16, 16, &spec).unwrap();
    let tc = CostModel::for_schedule(&spec, &theirs).unwrap();
    assert!((simulate(&theirs, &tc).unwrap().metrics.makespan - 84.0).abs() < 1e-6);
}

/// Between the V constructions' memory levels (V-Min at 4 × M_B, V-Half at 5 here) more
/// memory must still buy time: the list scheduler with a 1F1B-like cap on first-chunk
/// forwards in flight fills the gap, where memory alone (and before it, every candidate)
/// fell back to the plan of the level below (37.5, 61.5 and 85.5 from 3.5 to 4.5 × M_B).
#[test]
fn v_plans_between_the_constructions_use_the_memory() {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for m in [8, 16, 24] {
        let at = |x: f64| {
            let req = Request {
                mem_limit: MemLimit::Multiple(x),
                objective: nobubble_schedule::Objective::Makespan,
                placement: Some(nobubble_schedule::Placement::V),
                ..Request::new(ScheduleKind::ZbAuto, 8, m)
            };
            let s = generate(&req, &spec).unwrap();
            let c = CostModel::for_schedule(&spec, &s).unwrap();
            nobubble_schedule::validate(&s, &c, Some(x)).unwrap();
            simulate(&s, &c).unwrap().metrics.makespan
        };
        let (tight, between, half) = (at(3.5), at(4.5), at(5.0));
        assert!(
            between < tight - 0.5 && between > half,
            "p 8 m {m}: {tight} at 3.5, {between} at 4.5, {half} at 5"
        );
    }
}

#[test]
fn zb_paper_rebuilds_and_zb_auto_matches_or_beats_the_shared_heterogeneous_official_schedules() {
    // ../shared/data/reference-schedules: the authors' greedy (best of its 8 flag settings)
    // planned on true per-stage costs, at one absolute limit per rank — p microbatches of
    // the heaviest stage. zb-auto gets the same bytes: at or below it on the makespan
    // (makespan objective) and on the longest rank span (span objective).
    use nobubble_schedule::{plan as plan_request, Objective, PlanRequest};
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/reference-schedules"
    );
    for (stem, limit, m) in [
        ("hetero_P04_6.2B_p8_m24_paper-split_lim1p", 9_699_328.0, 24),
        ("hetero_S1_p8_m32_seed1084_lim1p", 8.0, 32),
    ] {
        let read = |ext: &str| {
            std::fs::read_to_string(format!("{dir}/{stem}{ext}"))
                .expect("the shared reference schedules")
        };
        let spec = CostSpec::from_json(&read(".costs.json")).unwrap();
        let official =
            nobubble_schedule::export::csv::read(&read("_official.csv"), "official").unwrap();
        let costs = CostModel::for_schedule(&spec, &official).unwrap();
        let sim = simulate(&official, &costs).unwrap();
        let official_span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
        // Our reimplementation of that greedy (zb-paper: on uneven stages it also plans on
        // each stage's own costs) rebuilds the official schedule's figures exactly.
        let paper = plan_request(&PlanRequest {
            mem_limit: MemLimit::Bytes(limit),
            ..PlanRequest::new(ScheduleKind::ZbPaper, 8, m, spec.clone())
        })
        .unwrap();
        let paper_span = paper.sim.metrics.span.iter().copied().fold(0.0, f64::max);
        assert!(
            (paper.sim.metrics.makespan - sim.metrics.makespan).abs()
                <= 1e-9 * sim.metrics.makespan
                && (paper_span - official_span).abs() <= 1e-9 * official_span,
            "{stem}: zb-paper {} / {paper_span} against the official {} / {official_span}",
            paper.sim.metrics.makespan,
            sim.metrics.makespan
        );
        for objective in [Objective::Makespan, Objective::Span] {
            let req = PlanRequest {
                mem_limit: MemLimit::Bytes(limit),
                placement: Some(nobubble_schedule::Placement::Linear),
                objective,
                ..PlanRequest::new(ScheduleKind::ZbAuto, 8, m, spec.clone())
            };
            let ours = plan_request(&req).unwrap();
            ours.check_limit().unwrap();
            let span = ours.sim.metrics.span.iter().copied().fold(0.0, f64::max);
            let (got, want) = match objective {
                Objective::Makespan => (ours.sim.metrics.makespan, sim.metrics.makespan),
                _ => (span, official_span),
            };
            assert!(
                got <= want * (1.0 + 1e-9),
                "{stem} {objective:?}: zb-auto {got} against the official {want}"
            );
        }
    }
}

/// Random heterogeneous pipelines: per-stage F, I, W, comm, and per-stage memory.
fn hetero_strategy() -> impl Strategy<Value = (usize, usize, CostSpec)> {
    (2usize..=8)
        .prop_flat_map(|p| (Just(p), p..=4 * p))
        .prop_flat_map(|(p, m)| {
            let stage = (
                0.5..3.0f64,
                0.5..3.0f64,
                0.3..2.0f64,
                0.5..2.0f64,
                0.1..0.9f64,
            );
            (
                Just(p),
                Just(m),
                prop::collection::vec(stage, p),
                0.0..0.3f64,
            )
        })
        .prop_map(|(p, m, stages, comm)| {
            let stages = stages
                .into_iter()
                .map(|(f, i, w, mem_b, frac)| RankCost {
                    f,
                    i,
                    w,
                    mem_b,
                    mem_w: frac * mem_b,
                    b: None,
                })
                .collect();
            (p, m, CostSpec { comm, stages })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn zb_auto_is_never_longer_than_the_official_greedy_on_heterogeneous_memory(
        (p, m, spec) in hetero_strategy(),
        level in 0usize..3,
    ) {
        // Bytes per rank: p, 1.5p or 2p microbatches of the heaviest stage (the same on every
        // rank), as the authors' comparison gives both schedulers.
        use nobubble_schedule::{plan as plan_request, Objective, PlanRequest};
        let heaviest = spec.stages.iter().map(|c| c.mem_b).fold(0.0, f64::max);
        let bytes = heaviest * [1.0, 1.5, 2.0][level] * p as f64;
        for objective in [Objective::Makespan, Objective::Span] {
            let req = |kind| PlanRequest {
                mem_limit: MemLimit::Bytes(bytes),
                // zb-paper is linear by construction (and takes no placement).
                placement: (kind == ScheduleKind::ZbAuto).then_some(nobubble_schedule::Placement::Linear),
                objective,
                ..PlanRequest::new(kind, p, m, spec.clone())
            };
            // Below what the paper's warm-up needs it finds nothing (zb-auto still plans).
            let Ok(theirs) = plan_request(&req(ScheduleKind::ZbPaper)) else { continue };
            let ours = plan_request(&req(ScheduleKind::ZbAuto)).unwrap();
            ours.check_limit().unwrap();
            let measure = |s: &nobubble_schedule::Planned| match objective {
                Objective::Makespan => s.sim.metrics.makespan,
                _ => s.sim.metrics.span.iter().copied().fold(0.0, f64::max),
            };
            prop_assert!(
                measure(&ours) <= measure(&theirs) * (1.0 + 1e-9),
                "p={p} m={m} bytes={bytes} {objective:?}: zb-auto {} vs zb-paper {}",
                measure(&ours), measure(&theirs)
            );
        }
    }
}

/// A layer split is planned within the bytes the even split's multiple of M_B means, and
/// judged against those bytes: a split that moves blocks off a rank holds more microbatches
/// there than a multiple of its own, smaller M_B would allow. (The 8B model of
/// `docs/examples` on 8 blocks; at 3 × M_B the chosen V split's rank 0 holds more than 3 ×
/// its own M_B, which the planner used to refuse with an error telling the user to plan with
/// zb-auto, the schedule they had asked for.)
#[test]
fn a_layer_split_is_judged_against_the_even_splits_bytes() {
    use nobubble_schedule::split::{even_counts, LayerCosts};
    use nobubble_schedule::{plan as plan_request, PlanCosts, PlanRequest};
    let text = include_str!("../../../docs/examples/layers-8b-vocab128k.json");
    let mut layers: LayerCosts = serde_json::from_str(text).unwrap();
    layers.count = 8;
    let blocks = layers.blocks().unwrap().len();
    let mut over_own = 0;
    for x in [2.0, 2.5, 3.0, 4.0, 6.0] {
        let req = PlanRequest {
            mem_limit: MemLimit::Multiple(x),
            costs: PlanCosts::Layers(layers.clone()),
            ..PlanRequest::new(
                ScheduleKind::ZbAuto,
                4,
                8,
                CostSpec::uniform(RankCost::default(), 0.0),
            )
        };
        let planned = plan_request(&req).unwrap_or_else(|e| panic!("x = {x}: {e}"));
        planned.check_limit().unwrap();
        let s = &planned.schedule;
        let even = layers.spec(&even_counts(blocks, s.stages)).unwrap();
        let even = CostModel::for_schedule(&even, s).unwrap();
        let own = CostModel::for_schedule(
            &layers
                .spec(&planned.split.as_ref().unwrap().counts)
                .unwrap(),
            s,
        )
        .unwrap();
        for r in 0..s.ranks {
            let peak = planned.sim.metrics.peak_memory[r];
            let budget = x * even.placed_mem_b(&s.placement, r);
            assert!(
                peak <= budget * (1.0 + 1e-9),
                "x = {x}, rank {r}: {peak} > {budget}"
            );
            if peak > x * own.placed_mem_b(&s.placement, r) * (1.0 + 1e-9) {
                over_own += 1;
            }
        }
        let bound = planned.lower_bound();
        assert!(
            bound <= planned.sim.metrics.makespan * (1.0 + 1e-9),
            "x = {x}"
        );
    }
    assert!(
        over_own > 0,
        "no limit exercised a rank beyond its own multiple"
    );
}

/// Above the ladder's size, a limit under p starves the handcrafted schedules and the paper's
/// greedy (p 32, m 256, 20 × M_B: 7982 against a bound of 1012, 689% above; twice the
/// microbatches of m 128 cost 12.8 times the time). The list scheduler's runs keep zb-auto
/// near the bound there, at every limit under p.
#[test]
fn large_pipelines_under_tight_limits_stay_near_the_bound() {
    use nobubble_schedule::{plan as plan_request, PlanRequest};
    let spec = grid_costs(0.1);
    for x in [8.0, 16.0, 20.0, 28.0] {
        let req = PlanRequest {
            mem_limit: MemLimit::Multiple(x),
            ..PlanRequest::new(ScheduleKind::ZbAuto, 32, 256, spec.clone())
        };
        let planned = plan_request(&req).unwrap();
        planned.check_limit().unwrap();
        let gap = planned.sim.metrics.makespan / planned.lower_bound() - 1.0;
        assert!(gap < 0.12, "x = {x}: {:.1}% above the bound", 100.0 * gap);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// The planner judges and bounds a zb-auto plan where it was planned: a V plan chosen
    /// over the linear one holds x × each rank's *linear* M_B, so with uneven memory it
    /// fits its own limit check (a V layout's M_B per rank is another amount), and the
    /// budgets it reports are those bytes.
    #[test]
    fn a_planned_v_plan_passes_its_own_limit_check_with_uneven_memory(
        (p, m, spec) in (2usize..=5, 2usize..=12).prop_flat_map(|(p, m)| (Just(p), Just(m), costs_strategy(p))),
        mem in proptest::collection::vec(0.5f64..2.0, 5),
        x in 1usize..=8,
    ) {
        let mut spec = spec;
        for (c, &b) in spec.stages.iter_mut().zip(&mem) {
            c.mem_w *= b;
            c.mem_b = b;
        }
        let x = x as f64;
        for objective in [nobubble_schedule::Objective::Span, nobubble_schedule::Objective::Makespan] {
            let req = nobubble_schedule::PlanRequest {
                mem_limit: MemLimit::Multiple(x),
                objective,
                ..nobubble_schedule::PlanRequest::new(ScheduleKind::ZbAuto, p, m, spec.clone())
            };
            let planned = nobubble_schedule::plan(&req).unwrap();
            prop_assert!(planned.check_limit().is_ok(), "{:?}", planned.check_limit());
            let linear = CostModel::for_layout(&spec, p, p).unwrap();
            let s = &planned.schedule;
            for r in 0..p {
                let allowed = planned.costs.rank_limit(s, r, x);
                prop_assert!((allowed - x * linear.stages[r].mem_b).abs() <= 1e-9 * allowed);
                prop_assert!(planned.peak_memory()[r] <= allowed * (1.0 + 1e-9));
            }
            prop_assert!(planned.lower_bound() <= planned.sim.metrics.makespan * (1.0 + 1e-9));
        }
    }
}

/// The case a review found: zb-auto's V plan at the linear layout's bytes was checked against
/// the V layout's M_B and refused (rank 0: 7.494 over 4 × 1.776).
#[test]
fn a_v_plan_on_per_rank_costs_fits_the_limit_it_was_planned_at() {
    let rank = |f, i, w, mem_b, mem_w| RankCost {
        f,
        i,
        w,
        mem_b,
        mem_w,
        b: None,
    };
    let spec = CostSpec {
        stages: vec![
            rank(1.340, 1.313, 1.001, 1.906, 0.428),
            rank(1.232, 0.336, 1.619, 1.590, 0.290),
            rank(1.574, 0.537, 1.974, 0.792, 0.633),
            rank(0.348, 0.662, 1.052, 1.646, 0.594),
        ],
        comm: 0.0,
    };
    let req = nobubble_schedule::PlanRequest {
        mem_limit: MemLimit::Multiple(4.0),
        objective: nobubble_schedule::Objective::Makespan,
        ..nobubble_schedule::PlanRequest::new(ScheduleKind::ZbAuto, 4, 8, spec)
    };
    let planned = nobubble_schedule::plan(&req).unwrap();
    assert_eq!(planned.schedule.stages, 8, "the V plan is the faster here");
    planned.check_limit().unwrap();
    assert!((planned.costs.rank_limit(&planned.schedule, 0, 4.0) - 4.0 * 1.906).abs() < 1e-9);
}
