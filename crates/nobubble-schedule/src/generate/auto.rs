//! `zb-auto`: the best schedule we can find under a memory limit, with real costs.
//!
//! Candidates come from the list scheduler ([`super::greedy`]) under every combination of
//! its policies, and from the handcrafted schedules that fit the limit; the best by the
//! simulator is then improved by local search (moving weight gradients). The objective is
//! the paper's: the longest per-rank span, then the makespan.

use super::greedy::{list_schedule, Policy};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::{simulate, span_and_makespan};
use crate::validate::check_memory;

/// (longest rank span, makespan): what the searches minimize, in that order.
pub(crate) type Score = (f64, f64);

/// Objective of a simulated schedule; smaller is better.
pub(crate) fn score(schedule: &Schedule, costs: &CostModel) -> Result<Score, Error> {
    match span_and_makespan(schedule, costs) {
        Some(s) => Ok(s),
        // Let the full simulator explain the failure.
        None => Err(simulate(schedule, costs)
            .err()
            .unwrap_or_else(|| Error::Input("schedule could not be scored".into()))),
    }
}

fn better(a: Score, b: Score) -> bool {
    const EPS: f64 = 1e-9;
    a.0 < b.0 - EPS * b.0.abs().max(1.0)
        || ((a.0 - b.0).abs() <= EPS * b.0.abs().max(1.0) && a.1 < b.1 - EPS * b.1.abs().max(1.0))
}

/// The policy combinations the search tries.
pub(crate) fn policies() -> Vec<Policy> {
    let mut out = Vec::new();
    for delay in [false, true] {
        for over in [0.0, 0.5, 1e9] {
            for deeper in [true, false] {
                out.push(Policy {
                    forward_may_delay_backward: delay,
                    w_overshoot: over,
                    max_in_flight: usize::MAX,
                    deeper_forward_first: deeper,
                });
            }
        }
    }
    out
}

/// Keeps the best of `candidates` that fit the memory limit.
pub(crate) fn pick_best(
    candidates: impl IntoIterator<Item = Schedule>,
    costs_for: &dyn Fn(&Schedule) -> Result<CostModel, Error>,
    x: f64,
) -> Result<Option<(Schedule, Score)>, Error> {
    let mut best: Option<(Schedule, Score)> = None;
    for s in candidates {
        let costs = costs_for(&s)?;
        if check_memory(&s, &costs, x).is_err() {
            continue;
        }
        let sc = score(&s, &costs)?;
        if best.as_ref().is_none_or(|(_, b)| better(sc, *b)) {
            best = Some((s, sc));
        }
    }
    Ok(best)
}

/// Local search: move single weight-gradient passes to other positions on their rank,
/// keeping every move that improves the objective and fits the memory limit, until a full
/// sweep finds nothing or `max_evals` simulations have run.
pub(crate) fn improve(
    mut best: Schedule,
    mut best_score: Score,
    costs: &CostModel,
    x: f64,
    max_evals: usize,
) -> Result<(Schedule, Score), Error> {
    let mut evals = 0;
    loop {
        let mut improved = false;
        for r in 0..best.ranks {
            let len = best.orders[r].len();
            let mut k = 0;
            while k < len {
                if best.orders[r][k].kind != crate::Kind::W {
                    k += 1;
                    continue;
                }
                // Try moving this W one or several places later or earlier.
                for delta in [1isize, -1, 2, -2, 4, -4] {
                    let to = k as isize + delta;
                    if to < 0 || to >= len as isize {
                        continue;
                    }
                    let mut cand = best.clone();
                    let a = cand.orders[r].remove(k);
                    cand.orders[r].insert(to as usize, a);
                    if crate::validate::check_structure(&cand).is_err()
                        || check_memory(&cand, costs, x).is_err()
                    {
                        continue;
                    }
                    evals += 1;
                    if let Ok(sc) = score(&cand, costs) {
                        if better(sc, best_score) {
                            best = cand;
                            best_score = sc;
                            improved = true;
                            break;
                        }
                    }
                    if evals >= max_evals {
                        return Ok((best, best_score));
                    }
                }
                k += 1;
            }
        }
        if !improved {
            return Ok((best, best_score));
        }
    }
}

/// Runs the list scheduler under every policy for `placement`, returning the best that fits.
pub(crate) fn best_list_schedule(
    name: &str,
    placement: &[usize],
    ranks: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
) -> Result<Vec<Schedule>, Error> {
    let mut out = Vec::new();
    let mut last_err = None;
    for pol in policies() {
        match list_schedule(name, placement, ranks, m, costs, x, &pol) {
            Ok(s) => out.push(s),
            Err(e) => last_err = Some(e),
        }
    }
    if out.is_empty() {
        return Err(last_err.expect("at least one policy ran"));
    }
    Ok(out)
}

/// `zb-auto` on a linear placement (stage s on rank s) with memory limit `x` × M_B.
pub fn zb_auto(
    p: usize,
    m: usize,
    spec: &crate::cost::CostSpec,
    x: f64,
    name: &str,
) -> Result<Schedule, Error> {
    let placement: Vec<usize> = (0..p).collect();
    let costs = CostModel::for_layout(spec, p, p)?;
    let mut candidates = best_list_schedule(name, &placement, p, m, &costs, x)?;
    candidates.push(super::zb_h1(p, m)?);
    candidates.push(super::zb_h2(p, m)?);
    let (best, sc) = pick_best(candidates, &|_| Ok(costs.clone()), x)?
        .ok_or_else(|| Error::Input(format!("no schedule fits memory limit {x} × M_B")))?;
    let budget = (400_000 / (3 * p * m)).clamp(10, 3000);
    let (best, sc) = template_search(p, m, &costs, x, best, sc, name)?;
    let (mut best, _) = improve(best, sc, &costs, x, budget)?;
    best.name = name.to_string();
    Ok(best)
}

/// Per-stage warm-up, per-stage lag, and their score.
type Template = (Vec<usize>, Vec<usize>, Score);

/// How many forwards stage `s` can finish, beyond its first, before the input gradient of
/// microbatch 0 can arrive: the warm-up that exactly fills the start-up wait, from costs.
fn natural_warmup(p: usize, m: usize, costs: &CostModel) -> Vec<usize> {
    let c = costs.comm;
    let st = &costs.stages;
    let f_total: f64 = st.iter().map(|x| x.f).sum();
    // Earliest end of F(s, j) if every stage runs forwards back to back.
    let mut ends = vec![vec![0.0; m]; p];
    for s in 0..p {
        for j in 0..m {
            let own = if j > 0 { ends[s][j - 1] } else { 0.0 };
            let up = if s > 0 { ends[s - 1][j] + c } else { 0.0 };
            ends[s][j] = own.max(up) + st[s].f;
        }
    }
    (0..p)
        .map(|s| {
            let arrival = f_total
                + (p - 1) as f64 * c
                + st[s + 1..].iter().map(|x| x.i).sum::<f64>()
                + (p - 1 - s) as f64 * c;
            (1..m).take_while(|&j| ends[s][j] <= arrival + 1e-9).count()
        })
        .collect()
}

/// Search over the ZB-H family (per-stage warm-up and W lag): first a grid over a
/// three-parameter shape — warm-up = natural + γ, lag = α·s + β — then coordinate descent
/// on single stages, within `max_evals` simulations. Keeps `incumbent` if nothing beats it.
fn template_search(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    incumbent: Schedule,
    inc_score: Score,
    name: &str,
) -> Result<(Schedule, Score), Error> {
    let evals = std::cell::Cell::new(0usize);
    let delay = std::cell::Cell::new(m);
    let max_evals = (20_000_000 / (3 * p * m)).clamp(60, 3000);
    let eval = |warm: &[usize], lag: &[usize]| -> Option<Score> {
        evals.set(evals.get() + 1);
        let s = super::zb_template(p, m, warm, lag, delay.get(), name).ok()?;
        check_memory(&s, costs, x).ok()?;
        score(&s, costs).ok()
    };
    let natural = natural_warmup(p, m, costs);
    let mut best: Option<Template> = None;
    let shape = |gamma: i64, alpha: f64, beta: f64| -> (Vec<usize>, Vec<usize>) {
        let warm = natural
            .iter()
            .map(|&w| (w as i64 + gamma).clamp(0, m as i64) as usize)
            .collect();
        let lag = (0..p)
            .map(|s| (alpha * s as f64 + beta).round().clamp(0.0, m as f64) as usize)
            .collect();
        (warm, lag)
    };
    let mut best_delay = m;
    for d in [m, 0, p / 2, p, 2 * p] {
        delay.set(d);
        for gamma in [0i64, -1, 1, -2] {
            for ai in 0..=16 {
                for beta in [0.0, 1.0, -1.0, 2.0] {
                    let (w, l) = shape(gamma, ai as f64 * 0.25, beta);
                    if let Some(sc) = eval(&w, &l) {
                        if best.as_ref().is_none_or(|b| better(sc, b.2)) {
                            best = Some((w, l, sc));
                            best_delay = d;
                        }
                    }
                }
            }
        }
    }
    delay.set(best_delay);
    let Some((mut warm, mut lag, mut cur)) = best else {
        return Ok((incumbent, inc_score));
    };
    'descent: loop {
        let mut moved = false;
        for s in 0..p {
            for (dw, dl) in [(0i64, 1i64), (0, -1), (1, 0), (-1, 0), (1, -1), (-1, 1)] {
                if evals.get() >= max_evals {
                    break 'descent;
                }
                let nw = warm[s] as i64 + dw;
                let nl = lag[s] as i64 + dl;
                if nw < 0 || nl < 0 || nw as usize > m || nl as usize > m {
                    continue;
                }
                let (ow, ol) = (warm[s], lag[s]);
                warm[s] = nw as usize;
                lag[s] = nl as usize;
                match eval(&warm, &lag) {
                    Some(sc) if better(sc, cur) => {
                        cur = sc;
                        moved = true;
                    }
                    _ => {
                        warm[s] = ow;
                        lag[s] = ol;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    if better(cur, inc_score) {
        Ok((
            super::zb_template(p, m, &warm, &lag, delay.get(), name)?,
            cur,
        ))
    } else {
        Ok((incumbent, inc_score))
    }
}
