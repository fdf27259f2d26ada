//! The unit a user gives costs and memory in changes no plan's quality: seconds for a tiny
//! model (1e-11 per pass) plan as well as the paper's microseconds, and a change of unit by
//! a power of two gives the very same schedule.

use nobubble_schedule::split::LayerCosts;
use nobubble_schedule::{
    plan, CostSpec, MemLimit, PlanCosts, PlanRequest, Planned, RankCost, ScheduleKind,
};

/// Uneven per-rank costs (so that ties and memory differ across ranks), with every time
/// multiplied by `time` and every amount of memory by `mem`.
fn costs(time: f64, mem: f64) -> CostSpec {
    let stage = |k: f64| RankCost {
        f: (1.0 + 0.1 * k) * time,
        i: (1.2 + 0.05 * k) * time,
        w: 0.8 * time,
        mem_b: (1.0 + 0.25 * k) * mem,
        mem_w: 0.5 * mem,
        b: None,
    };
    CostSpec {
        comm: 0.05 * time,
        stages: [0.0, 2.0, 1.0, 3.0, 0.0, 1.0].map(stage).to_vec(),
    }
}

/// `kind` on p 6, m 18 under `limit` (bytes are in the unit of `mem`).
fn planned(kind: ScheduleKind, time: f64, mem: f64, limit: &MemLimit) -> Planned {
    let limit = match limit {
        MemLimit::Bytes(b) => MemLimit::Bytes(b * mem),
        other => other.clone(),
    };
    let req = PlanRequest {
        mem_limit: limit,
        ..PlanRequest::new(kind, 6, 18, costs(time, mem))
    };
    plan(&req).unwrap_or_else(|e| panic!("{} at {time:e}: {e}", kind.name()))
}

fn span(p: &Planned) -> f64 {
    p.sim.metrics.span.iter().copied().fold(0.0, f64::max)
}

const KINDS: [ScheduleKind; 4] = [
    ScheduleKind::ZbAuto,
    ScheduleKind::VAuto,
    ScheduleKind::ZbPaper,
    ScheduleKind::Zb1p,
];

fn limits() -> [MemLimit; 3] {
    [
        MemLimit::None,
        MemLimit::Multiple(3.0),
        MemLimit::Bytes(5.0),
    ]
}

#[test]
fn a_change_of_unit_by_a_power_of_two_plans_the_same_schedule() {
    let (tiny, huge) = (2f64.powi(-40), 2f64.powi(30));
    for kind in KINDS {
        for limit in limits() {
            let base = planned(kind, 1.0, 1.0, &limit);
            for (time, mem) in [(tiny, 2f64.powi(-45)), (huge, 2f64.powi(20))] {
                let other = planned(kind, time, mem, &limit);
                let what = format!("{} under {limit:?} at {time:e}", kind.name());
                assert!(other.schedule == base.schedule, "{what}: another schedule");
                assert_eq!(other.sim.metrics.makespan, base.sim.metrics.makespan * time);
                assert_eq!(other.sim.metrics.bubble_rate, base.sim.metrics.bubble_rate);
                assert_eq!(other.lower_bound(), base.lower_bound() * time, "{what}");
            }
        }
    }
}

#[test]
fn costs_in_any_unit_plan_as_well() {
    for kind in KINDS {
        for limit in limits() {
            let base = planned(kind, 1.0, 1.0, &limit);
            for (time, mem) in [(1e-11, 1e-12), (1e-3, 1e9), (1e7, 1e-6)] {
                let other = planned(kind, time, mem, &limit);
                let what = format!("{} under {limit:?} at {time:e}", kind.name());
                let fits = |p: &Planned| p.check_limit().is_ok();
                assert_eq!(fits(&other), fits(&base), "{what}");
                // Other units round other bits, so exact ties may break otherwise: within 1%.
                for (a, b) in [
                    (other.sim.metrics.makespan / time, base.sim.metrics.makespan),
                    (span(&other) / time, span(&base)),
                ] {
                    assert!((a / b - 1.0).abs() < 0.01, "{what}: {a} against {b}");
                }
                let rate = other.sim.metrics.bubble_rate;
                assert!(
                    (rate - base.sim.metrics.bubble_rate).abs() < 0.01,
                    "{what}: {rate}"
                );
                let gap = other.sim.metrics.makespan / other.lower_bound() - 1.0;
                let base_gap = base.sim.metrics.makespan / base.lower_bound() - 1.0;
                assert!(gap < base_gap + 0.01, "{what}: {gap} above the bound");
            }
        }
    }
}

#[test]
fn a_layer_split_is_chosen_the_same_in_any_power_of_two_unit() {
    let layers = |time: f64, mem: f64| {
        let cost = |f: f64, m: f64| RankCost {
            f: f * time,
            i: 1.1 * f * time,
            w: 0.9 * f * time,
            mem_b: m * mem,
            mem_w: 0.5 * m * mem,
            b: None,
        };
        LayerCosts {
            comm: 0.02 * time,
            embedding: cost(0.3, 0.2),
            blocks: Vec::new(),
            block: Some(cost(1.0, 1.0)),
            count: 10,
            head: cost(1.6, 0.9),
        }
    };
    let split = |time: f64, mem: f64| {
        let req = PlanRequest {
            costs: PlanCosts::Layers(layers(time, mem)),
            mem_limit: MemLimit::Multiple(3.0),
            ..PlanRequest::new(ScheduleKind::ZbAuto, 4, 12, costs(1.0, 1.0))
        };
        plan(&req).unwrap()
    };
    let base = split(1.0, 1.0);
    let (time, mem) = (2f64.powi(-38), 2f64.powi(-30));
    let other = split(time, mem);
    let counts = |p: &Planned| p.split.as_ref().unwrap().counts.clone();
    assert_eq!(counts(&other), counts(&base));
    assert!(other.schedule == base.schedule, "another schedule");
    assert_eq!(other.sim.metrics.makespan, base.sim.metrics.makespan * time);
    let scaled: Vec<f64> = base.peak_memory().iter().map(|b| b * mem).collect();
    assert_eq!(other.peak_memory(), &scaled[..]);
}

#[test]
fn errors_quote_the_users_units() {
    let spec = CostSpec::uniform(
        RankCost {
            mem_b: 2_100_000.0,
            mem_w: 1_000_000.0,
            ..RankCost::default()
        },
        0.0,
    );
    let req = PlanRequest {
        mem_limit: MemLimit::Bytes(1024.0),
        ..PlanRequest::new(ScheduleKind::ZbAuto, 2, 8, spec)
    };
    let e = plan(&req).unwrap_err().to_string();
    assert!(e.contains("1024B") && e.contains("2100000B"), "{e}");
}
