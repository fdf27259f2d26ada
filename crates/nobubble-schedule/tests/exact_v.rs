//! The exact search on V placements: on tiny pipelines it proves the optimum under memory
//! limits, so the V lower bounds can be checked against it (never above), and the V
//! planners' distance from optimal is known.

use nobubble_schedule::exact::min_makespan;
use nobubble_schedule::{
    check_memory, generate, lower_bound, simulate, span_lower_bound, CostModel, CostSpec, MemLimit,
    Objective, Placement, RankCost, Request, Schedule, ScheduleKind,
};

/// Uniform chunks, and one spec per chunk with uneven times and memory (a heavy head on
/// the last chunk, a light embedding on the first; rank 0 holds both).
fn cost_settings(p: usize) -> Vec<CostSpec> {
    let rank = |f: f64, i: f64, w: f64| RankCost {
        f,
        i,
        w,
        mem_b: 1.0,
        mem_w: 0.5,
        b: None,
    };
    let chunks: Vec<RankCost> = (0..2 * p)
        .map(|s| {
            let t = 1.0 + 0.37 * ((s * 7 + 3) % 5) as f64 / 4.0;
            RankCost {
                f: 0.5 * t,
                i: 0.6 * t,
                w: 0.35 * t,
                mem_b: 0.4 + 0.15 * ((s * 3) % 4) as f64,
                mem_w: 0.1 + 0.05 * (s % 3) as f64,
                b: None,
            }
        })
        .enumerate()
        .map(|(s, c)| match s {
            0 => RankCost {
                f: 0.2,
                i: 0.25,
                w: 0.1,
                ..c
            },
            s if s == 2 * p - 1 => RankCost {
                f: 1.1,
                i: 1.3,
                w: 0.9,
                mem_b: 1.2,
                ..c
            },
            _ => c,
        })
        .collect();
    vec![
        CostSpec::uniform(rank(1.0, 1.0, 1.0), 0.0),
        CostSpec::uniform(rank(1.0, 1.2, 0.8), 0.05),
        CostSpec::uniform(rank(2.0, 1.0, 1.5), 0.5),
        CostSpec {
            comm: 0.1,
            stages: chunks,
        },
    ]
}

fn plan_v(
    kind: ScheduleKind,
    p: usize,
    m: usize,
    spec: &CostSpec,
    x: Option<f64>,
) -> Option<Schedule> {
    let req = Request {
        mem_limit: x.map_or(MemLimit::None, MemLimit::Multiple),
        objective: Objective::Makespan,
        placement: Some(Placement::V),
        ..Request::new(kind, p, m)
    };
    generate(&req, spec).ok()
}

#[test]
fn v_bounds_never_exceed_the_proven_optimum() {
    let mut proven = 0;
    let mut at_optimum = 0;
    let mut worst: (f64, String) = (0.0, String::new());
    let mut bound_gaps = Vec::new();
    for (p, m) in [(2usize, 2usize), (2, 3), (2, 4), (3, 2), (3, 3)] {
        for spec in cost_settings(p) {
            for x in [Some(1.0), Some(1.5), Some(2.0), Some(3.0), None] {
                let Some(ours) = plan_v(ScheduleKind::ZbAuto, p, m, &spec, x) else {
                    continue;
                };
                let costs = CostModel::for_schedule(&spec, &ours).unwrap();
                let our_sim = simulate(&ours, &costs).unwrap();
                let makespan = our_sim.metrics.makespan;
                let e = min_makespan(&ours.placement, m, &costs, x, makespan + 1e-6, 2_000_000);
                if !e.proven {
                    continue;
                }
                proven += 1;
                let case = format!("p={p} m={m} {:?} limit {x:?}", spec.stages[0]);
                assert!(e.makespan <= makespan + 1e-6, "{case}");
                let (optimum, spans) = match &e.better {
                    Some(b) => {
                        if let Some(x) = x {
                            check_memory(b, &costs, x).unwrap();
                        }
                        let sim = simulate(b, &costs).unwrap();
                        assert!((sim.metrics.makespan - e.makespan).abs() < 1e-9, "{case}");
                        (e.makespan, sim.metrics.span)
                    }
                    None => (makespan, our_sim.metrics.span.clone()),
                };
                let lb = lower_bound(&ours.placement, m, &costs, x);
                assert!(
                    lb <= optimum + 1e-9,
                    "{case}: bound {lb} above optimum {optimum}"
                );
                bound_gaps.push(optimum / lb - 1.0);
                let span_lb = span_lower_bound(&ours.placement, m, &costs, x);
                let longest = spans.iter().copied().fold(0.0, f64::max);
                assert!(
                    span_lb <= longest + 1e-9,
                    "{case}: span bound {span_lb} above {longest}"
                );
                // v-auto plans the same placement; it can be no better than the optimum.
                if let Some(v) = plan_v(ScheduleKind::VAuto, p, m, &spec, x) {
                    let c = CostModel::for_schedule(&spec, &v).unwrap();
                    let ms = simulate(&v, &c).unwrap().metrics.makespan;
                    assert!(
                        ms >= optimum - 1e-9,
                        "{case}: v-auto {ms} below optimum {optimum}"
                    );
                }
                let gap = makespan / optimum - 1.0;
                if gap <= 1e-9 {
                    at_optimum += 1;
                }
                if gap > worst.0 {
                    worst = (gap, case);
                }
            }
        }
    }
    assert!(proven >= 50, "only {proven} V instances proven");
    bound_gaps.sort_by(f64::total_cmp);
    println!(
        "{proven} V instances proven, zb-auto at the optimum on {at_optimum}; worst gap {:.2}% ({}); \
         optimum above the makespan bound: median {:.2}%, worst {:.2}%",
        100.0 * worst.0,
        worst.1,
        100.0 * bound_gaps[bound_gaps.len() / 2],
        100.0 * bound_gaps[bound_gaps.len() - 1],
    );
}
