//! A fused backward `b` cheaper than `i + w` (PyTorch's split backward costs extra): the
//! simulator charges B at `b`, the bounds stay below every plan whether it fuses or splits,
//! and `zb-auto` fuses where that is faster — never where it is not.

use nobubble_schedule::{
    generate::{gpipe, interleaved_1f1b, one_f_one_b, zb_h1},
    lower_bound, plan, simulate, span_lower_bound, CostModel, CostSpec, Kind, MemLimit, Objective,
    PlanCosts, PlanRequest, RankCost, Schedule, ScheduleKind,
};

fn stage(f: f64, i: f64, w: f64, b: Option<f64>) -> RankCost {
    RankCost {
        f,
        i,
        w,
        b,
        mem_b: 1.0,
        mem_w: 0.5,
    }
}

fn uniform(b: Option<f64>) -> CostSpec {
    CostSpec::uniform(stage(1.0, 1.0, 1.0, b), 0.0)
}

fn makespan(s: &Schedule, spec: &CostSpec) -> f64 {
    let costs = CostModel::for_schedule(spec, s).unwrap();
    simulate(s, &costs).unwrap().metrics.makespan
}

fn fused_passes(s: &Schedule) -> usize {
    s.orders
        .iter()
        .flatten()
        .filter(|a| a.kind == Kind::B)
        .count()
}

/// B costs `b`: 1F1B's closed form (m + p − 1)(F + B) holds with the given B.
#[test]
fn the_simulator_charges_b_for_a_fused_backward() {
    for (p, m, b) in [(4, 8, 1.3), (3, 6, 2.0), (2, 5, 2.5)] {
        let spec = uniform(Some(b));
        let got = makespan(&one_f_one_b(p, m).unwrap(), &spec);
        let want = (m + p - 1) as f64 * (1.0 + b);
        assert!((got - want).abs() < 1e-9, "p {p} m {m}: {got} != {want}");
    }
}

/// The bounds hold for fused and split plans alike, on uneven stages whose B is anywhere from
/// below I to above I + W.
#[test]
fn bounds_stay_below_fused_and_split_plans() {
    for b in [0.4, 0.9, 1.5, 2.0, 2.6] {
        let spec = CostSpec {
            comm: 0.1,
            stages: (0..4)
                .map(|k| {
                    let t = 1.0 + 0.2 * k as f64;
                    stage(t, 1.1 * t, 0.9 * t, Some(b * t))
                })
                .collect(),
        };
        let m = 8;
        let schedules = [
            one_f_one_b(4, m).unwrap(),
            gpipe(4, m).unwrap(),
            zb_h1(4, m).unwrap(),
            interleaved_1f1b(2, m, 2).unwrap(),
        ];
        for s in schedules {
            let costs = CostModel::for_schedule(&spec, &s).unwrap();
            let sim = simulate(&s, &costs).unwrap();
            let bound = lower_bound(&s.placement, m, &costs, None);
            let span_bound = span_lower_bound(&s.placement, m, &costs, None);
            let span = sim.metrics.span.iter().cloned().fold(0.0, f64::max);
            assert!(
                bound <= sim.metrics.makespan + 1e-9,
                "{} b {b}: {bound}",
                s.name
            );
            assert!(span_bound <= span + 1e-9, "{} b {b}: {span_bound}", s.name);
        }
    }
}

fn zb_auto(p: usize, m: usize, spec: CostSpec, limit: MemLimit) -> nobubble_schedule::Planned {
    let req = PlanRequest {
        mem_limit: limit,
        objective: Objective::Makespan,
        ..PlanRequest::new(ScheduleKind::ZbAuto, p, m, spec)
    };
    plan(&req).unwrap()
}

/// With B well below I + W, zb-auto's plan fuses and is at least as fast as 1F1B; with B at
/// I + W (or not given) it splits as before; with B above I + W it never fuses.
#[test]
fn zb_auto_fuses_only_where_it_is_faster() {
    let (p, m) = (4, 8);
    let cheap = zb_auto(p, m, uniform(Some(1.2)), MemLimit::None);
    assert!(fused_passes(&cheap.schedule) > 0);
    let classic = (m + p - 1) as f64 * (1.0 + 1.2);
    assert!(cheap.sim.metrics.makespan <= classic + 1e-9);
    assert!(cheap.lower_bound() <= cheap.sim.metrics.makespan + 1e-9);

    let given = zb_auto(p, m, uniform(Some(2.0)), MemLimit::None);
    let missing = zb_auto(p, m, uniform(None), MemLimit::None);
    assert_eq!(given.schedule, missing.schedule);
    assert_eq!(fused_passes(&missing.schedule), 0);
    let dear = zb_auto(p, m, uniform(Some(2.5)), MemLimit::None);
    assert_eq!(fused_passes(&dear.schedule), 0);
}

/// Fusing never buys time with memory: under a tight limit the fused plan holds no more
/// than the split plan it came from, so it still meets the limit.
#[test]
fn a_fused_plan_meets_the_limit() {
    let (p, m) = (4, 12);
    for x in [1.0, 2.0, 4.0] {
        let planned = zb_auto(p, m, uniform(Some(1.5)), MemLimit::Multiple(x));
        planned.check_limit().unwrap();
        let peak = planned.peak_memory().iter().cloned().fold(0.0, f64::max);
        assert!(peak <= x + 1e-9, "limit {x}: peak {peak}");
    }
}

/// The costs file takes `b`, refuses a non-positive one, and omits it when not given.
#[test]
fn the_costs_file_reads_b() {
    let spec = CostSpec::from_json(
        r#"{"stages": [{"f": 1, "i": 1, "w": 1, "b": 1.5, "mem_b": 2, "mem_w": 1}]}"#,
    )
    .unwrap();
    assert_eq!(spec.stages[0].b, Some(1.5));
    let e = CostSpec::from_json(r#"{"stages": [{"f": 1, "i": 1, "w": 1, "b": 0}]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`b`") && e.contains("i + w"), "{e}");
    let text = serde_json::to_string(&uniform(None)).unwrap();
    assert!(!text.contains("\"b\""), "{text}");
}

/// More memory never plans worse with a cheaper B either (the review's cases): the fused
/// plans of tighter limits' split plans are weighed too.
#[test]
fn more_memory_never_plans_worse_with_a_fused_backward() {
    for (p, m, cost, objective) in [
        (3, 6, [2.0, 1.0, 1.0, 1.5], Objective::Makespan),
        (2, 8, [1.0, 2.0, 1.0, 0.3], Objective::Span),
        (4, 12, [1.0, 2.0, 1.0, 2.5], Objective::Makespan),
    ] {
        let spec = CostSpec::uniform(stage(cost[0], cost[1], cost[2], Some(cost[3])), 0.0);
        let mut last = f64::INFINITY;
        for x in 1..=2 * p {
            let req = PlanRequest {
                mem_limit: MemLimit::Multiple(x as f64),
                objective,
                ..PlanRequest::new(ScheduleKind::ZbAuto, p, m, spec.clone())
            };
            let planned = plan(&req).unwrap();
            planned.check_limit().unwrap();
            let got = match objective {
                Objective::Makespan => planned.sim.metrics.makespan,
                Objective::Span => planned.sim.metrics.span.iter().cloned().fold(0.0, f64::max),
            };
            assert!(
                got <= last + 1e-9,
                "p {p} m {m} {cost:?}: limit {x} gives {got} > {last}"
            );
            last = got;
        }
    }
}

/// Byte budgets too (a review's case, where the fused plan was held to the split plan's
/// peak, so that 804864 bytes planned a longer span than 603648).
#[test]
fn more_bytes_never_plan_worse_with_a_fused_backward() {
    let spec = CostSpec::uniform(
        RankCost {
            f: 0.926,
            i: 1.96,
            w: 1.249,
            b: Some(3.095),
            mem_b: 201216.0,
            mem_w: 100608.0,
        },
        0.0,
    );
    let mut last = f64::INFINITY;
    // Up to 14 × 100608 B, all m = 7 microbatches' activations (the old code's longer spans
    // were at 7 and 8).
    for k in 2..=14 {
        let req = PlanRequest {
            mem_limit: MemLimit::Bytes(k as f64 * 100608.0),
            objective: Objective::Span,
            ..PlanRequest::new(ScheduleKind::ZbAuto, 3, 7, spec.clone())
        };
        let planned = plan(&req).unwrap();
        planned.check_limit().unwrap();
        let span = planned.sim.metrics.span.iter().cloned().fold(0.0, f64::max);
        assert!(span <= last + 1e-9, "{k} × 100608 B: span {span} > {last}");
        last = span;
    }
}

/// Each stage's weight gradients (its Bs and Ws, on the rank that holds it) in microbatch
/// order: what keeps a fused plan's bits equal to 1F1B's.
fn weight_gradients_in_order(s: &Schedule) -> bool {
    s.orders.iter().all(|order| {
        (0..s.stages).all(|stage| {
            let mbs: Vec<usize> = order
                .iter()
                .filter(|a| a.stage == stage && matches!(a.kind, Kind::B | Kind::W))
                .map(|a| a.microbatch)
                .collect();
            mbs.windows(2).all(|w| w[0] < w[1])
        })
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, .. Default::default() })]

    /// Random pipelines with a fused backward below I + W on some stages: zb-auto's plan is
    /// valid, fits every limit, keeps each stage's weight gradients in microbatch order, is
    /// never slower than the fixed patterns of its placement that fit (1F1B, DualPipeV), never
    /// worse with more memory in multiples of M_B, and in bytes never worse than the split plan.
    #[test]
    fn fused_plans_are_valid_ordered_and_monotone(
        p in 2usize..=5,
        extra in 0usize..=7,
        costs in proptest::collection::vec((0.5f64..2.0, 0.5f64..2.0, 0.3f64..1.5, 0.4f64..1.1, 0.5f64..1.5), 5),
        objective in proptest::sample::select(vec![Objective::Makespan, Objective::Span]),
    ) {
        let m = p + extra;
        let stages: Vec<RankCost> = costs[..p].iter().map(|&(f, i, w, share, mem)| RankCost {
            f, i, w, b: Some(share * (i + w)), mem_b: mem, mem_w: mem * 0.4,
        }).collect();
        let spec = CostSpec { comm: 0.0, stages };
        let ranked = |s: &Schedule| {
            let c = CostModel::for_schedule(&spec, s).unwrap();
            let sim = simulate(s, &c).unwrap();
            let span = sim.metrics.span.iter().cloned().fold(0.0, f64::max);
            match objective {
                Objective::Makespan => sim.metrics.makespan,
                Objective::Span => span,
            }
        };
        let mut last = f64::INFINITY;
        for x in 1..=2 * p {
            let limit = MemLimit::Multiple(x as f64);
            let req = PlanRequest {
                mem_limit: limit.clone(),
                objective,
                ..PlanRequest::new(ScheduleKind::ZbAuto, p, m, spec.clone())
            };
            let planned = plan(&req).unwrap();
            planned.check_limit().unwrap();
            proptest::prop_assert!(weight_gradients_in_order(&planned.schedule));
            let got = ranked(&planned.schedule);
            proptest::prop_assert!(got <= last + 1e-9, "limit {x}: {got} > {last}");
            last = got;
            // The same in bytes: budgets of x × the heaviest stage's M_B on every rank.
            let heaviest = costs[..p].iter().map(|c| c.4).fold(0.0, f64::max);
            let bytes = PlanRequest {
                mem_limit: MemLimit::Bytes(x as f64 * heaviest),
                ..req.clone()
            };
            let in_bytes = plan(&bytes).unwrap();
            in_bytes.check_limit().unwrap();
            proptest::prop_assert!(weight_gradients_in_order(&in_bytes.schedule));
            // Byte budgets are not monotone even for split plans (each rank's share is capped
            // at m), so the check here is against the split plan at the same bytes.
            let split_spec = CostSpec {
                comm: 0.0,
                stages: spec.stages.iter().map(|s| RankCost { b: None, ..*s }).collect(),
            };
            let split = plan(&PlanRequest {
                costs: PlanCosts::Stages(split_spec),
                ..bytes.clone()
            })
            .unwrap();
            let got_bytes = ranked(&in_bytes.schedule);
            let split_bytes = ranked(&split.schedule);
            proptest::prop_assert!(
                got_bytes <= split_bytes + 1e-9,
                "{x} × heaviest: fused {got_bytes} > split {split_bytes}"
            );
            // The fixed patterns, at the bytes zb-auto was given (the linear layout's M_B).
            let dualpipe = nobubble_schedule::generate::dualpipe_v(p, m).ok();
            for fixed in std::iter::once(one_f_one_b(p, m).unwrap()).chain(dualpipe) {
                let c = CostModel::for_schedule(&spec, &fixed).unwrap();
                let linear = CostModel::for_layout(&spec, p, p).unwrap();
                let budget: Vec<f64> = (0..p).map(|r| x as f64 * linear.stages[r].mem_b).collect();
                if nobubble_schedule::validate::check_memory_budget(&fixed, &c, &budget).is_ok() {
                    proptest::prop_assert!(got <= ranked(&fixed) + 1e-9, "limit {x}: {got} > {} {}", fixed.name, ranked(&fixed));
                }
            }
        }
    }
}
