//! `nobubble bench baseline`: `zb-auto` against our reimplementation of the authors' greedy
//! (`zb-paper`) on random heterogeneous pipelines — at limits relative to each rank's own
//! M_B, and at one amount of memory for every rank (so uneven stage memory binds unevenly),
//! as the authors' scheduler is usually given it.

use super::{BaselineBenchArgs, Rng};
use nobubble_schedule::{
    generate, simulate, CostModel, CostSpec, MemLimit, Objective, Placement, Request, ScheduleKind,
};
use serde_json::json;
use std::time::Instant;

/// `bench baseline`.
pub fn baseline(a: &BaselineBenchArgs) -> Result<(), String> {
    if a.cases == 0 {
        return Err("--cases must be at least 1".into());
    }
    let mut rng = Rng(a.seed);
    let (mut better, mut equal, mut worse) = (0usize, 0usize, 0usize);
    let (mut sum_ours, mut sum_theirs, mut best_gain) = (0.0, 0.0, 0.0f64);
    // The span is what both minimize; bubble rates compare badly across placements (a V
    // placement evens out the ranks' work, so its busiest rank is less busy).
    let mut span_ratio = 0.0;
    let started = Instant::now();
    for case in 0..a.cases {
        let (p, m, spec) = rng.pipeline();
        let x = p as f64 + rng.range(0.0, (p + 1) as f64);
        let rate = |kind: ScheduleKind| -> Result<(f64, f64), String> {
            let req = Request {
                mem_limit: MemLimit::Multiple(x),
                ..Request::new(kind, p, m)
            };
            let s = generate(&req, &spec).map_err(|e| format!("case {case}: {e}"))?;
            let c = CostModel::for_schedule(&spec, &s).map_err(|e| e.to_string())?;
            let sim = simulate(&s, &c).map_err(|e| e.to_string())?;
            let span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
            Ok((span, sim.metrics.bubble_rate))
        };
        let (ours_span, ours) = rate(ScheduleKind::ZbAuto)?;
        let (theirs_span, theirs) = rate(ScheduleKind::ZbPaper)?;
        let tol = 1e-9 * theirs_span;
        if ours_span < theirs_span - tol {
            better += 1;
        } else if ours_span > theirs_span + tol {
            worse += 1;
        } else {
            equal += 1;
        }
        sum_ours += ours;
        sum_theirs += theirs;
        span_ratio += ours_span / theirs_span;
        best_gain = best_gain.max(1.0 - ours_span / theirs_span);
        if !a.json && (case + 1) % 50 == 0 {
            eprintln!("  {}/{} pipelines", case + 1, a.cases);
        }
    }
    let n = a.cases as f64;
    let budgets = byte_budgets(a);
    if a.json {
        println!(
            "{}",
            json!({"cases": a.cases, "seed": a.seed, "better": better, "equal": equal,
                   "worse": worse, "mean_bubble_zb_auto": sum_ours / n,
                   "mean_bubble_zb_paper": sum_theirs / n, "mean_span_ratio": span_ratio / n,
                   "largest_span_gain": best_gain,
                   "byte_budgets": budgets.iter().map(Budget::json).collect::<Vec<_>>()})
        );
        return Ok(());
    }
    println!(
        "zb-auto against the paper's scheduler (zb-paper) on {} random pipelines (seed {}), {:.1} s",
        a.cases,
        a.seed,
        started.elapsed().as_secs_f64()
    );
    println!(
        "  longest span: zb-auto shorter in {better}, equal in {equal}, longer in {worse}; \
         {:.2}% shorter on average, at most {:.2}%",
        100.0 * (1.0 - span_ratio / n),
        100.0 * best_gain
    );
    println!(
        "  mean bubble rate: zb-auto {:.2}%, zb-paper {:.2}% (across placements the span is the \
         measure: a V placement evens out the ranks' work)",
        100.0 * sum_ours / n,
        100.0 * sum_theirs / n,
    );
    print_budgets(&budgets);
    Ok(())
}

/// One row of the byte-budget comparison: a limit (× the heaviest stage's M_B, per rank)
/// and an objective, and how zb-auto's measure compares with zb-paper's on each pipeline.
struct Budget {
    /// The limit in units of p × the heaviest stage's M_B.
    of_p: f64,
    objective: Objective,
    shorter: usize,
    equal: usize,
    longer: usize,
    /// Pipelines where either planner found no schedule within the bytes.
    skipped: usize,
    /// Mean and worst of zb-auto / zb-paper.
    ratio_sum: f64,
    worst: f64,
}

impl Budget {
    fn new(of_p: f64, objective: Objective) -> Budget {
        Budget {
            of_p,
            objective,
            shorter: 0,
            equal: 0,
            longer: 0,
            skipped: 0,
            ratio_sum: 0.0,
            worst: 0.0,
        }
    }

    fn compared(&self) -> usize {
        self.shorter + self.equal + self.longer
    }

    fn json(&self) -> serde_json::Value {
        json!({"limit_p_times_heaviest_mb": self.of_p, "objective": self.objective.name(),
               "shorter": self.shorter, "equal": self.equal, "longer": self.longer,
               "skipped": self.skipped,
               "mean_ratio": self.ratio_sum / self.compared().max(1) as f64,
               "worst_ratio": self.worst})
    }
}

/// zb-auto (linear placement) against zb-paper at p, 1.5p and 2p × the heaviest stage's M_B
/// on every rank, for both objectives: the comparison the 72 pipelines were.
fn byte_budgets(a: &BaselineBenchArgs) -> Vec<Budget> {
    let mut rows: Vec<Budget> = [1.0, 1.5, 2.0]
        .into_iter()
        .flat_map(|of_p| [Objective::Makespan, Objective::Span].map(|o| Budget::new(of_p, o)))
        .collect();
    let mut rng = Rng(a.seed ^ 0x5eed);
    for _ in 0..a.cases {
        let (p, m, spec) = rng.pipeline();
        let heaviest = spec.stages.iter().map(|s| s.mem_b).fold(0.0, f64::max);
        for row in &mut rows {
            let limit = MemLimit::Bytes(row.of_p * p as f64 * heaviest);
            let measure = |kind| measure(kind, p, m, &spec, &limit, row.objective);
            let (Some(ours), Some(theirs)) = (
                measure(ScheduleKind::ZbAuto),
                measure(ScheduleKind::ZbPaper),
            ) else {
                row.skipped += 1;
                continue;
            };
            let tol = 1e-9 * theirs;
            if ours < theirs - tol {
                row.shorter += 1;
            } else if ours > theirs + tol {
                row.longer += 1;
            } else {
                row.equal += 1;
            }
            row.ratio_sum += ours / theirs;
            row.worst = row.worst.max(ours / theirs);
        }
    }
    rows
}

/// The objective's measure of `kind` planned within `limit` on the linear placement (`None`
/// when nothing fits).
fn measure(
    kind: ScheduleKind,
    p: usize,
    m: usize,
    spec: &CostSpec,
    limit: &MemLimit,
    objective: Objective,
) -> Option<f64> {
    let req = Request {
        mem_limit: limit.clone(),
        objective,
        // zb-paper is linear by construction and refuses a placement.
        placement: (kind == ScheduleKind::ZbAuto).then_some(Placement::Linear),
        ..Request::new(kind, p, m)
    };
    let s = generate(&req, spec).ok()?;
    let c = CostModel::for_schedule(spec, &s).ok()?;
    limit.check_schedule(&s, &c).ok()?;
    let metrics = simulate(&s, &c).ok()?.metrics;
    Some(match objective {
        Objective::Makespan => metrics.makespan,
        Objective::Span => metrics.span.iter().copied().fold(0.0, f64::max),
    })
}

fn print_budgets(rows: &[Budget]) {
    println!(
        "  at one amount of memory on every rank (linear placement), zb-auto against zb-paper \
         by the objective's measure:"
    );
    println!("    limit per rank            objective  shorter  equal  longer  mean ratio  worst");
    for r in rows {
        println!(
            "    {:>3} × p × heaviest M_B   {:<9}  {:>7}  {:>5}  {:>6}  {:>10.4}  {:.4}{}",
            r.of_p,
            r.objective.name(),
            r.shorter,
            r.equal,
            r.longer,
            r.ratio_sum / r.compared().max(1) as f64,
            r.worst,
            if r.skipped > 0 {
                format!("  ({} skipped: nothing fits)", r.skipped)
            } else {
                String::new()
            }
        );
    }
}
