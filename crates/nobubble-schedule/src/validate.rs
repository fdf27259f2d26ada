//! Structural rules every schedule must follow before its timing means anything.
//!
//! Cross-rank deadlocks are found by the simulator (a schedule deadlocks exactly when the
//! simulation cannot make progress), and memory limits by [`check_memory`]; [`validate`]
//! runs all three.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::simulate;

/// Where each (stage, microbatch) pass was listed, to spot duplicates and order errors.
struct Seen {
    m: usize,
    pos: [Vec<Option<usize>>; 4],
}

impl Seen {
    fn new(stages: usize, m: usize) -> Seen {
        let v = || vec![None; stages * m];
        Seen {
            m,
            pos: [v(), v(), v(), v()],
        }
    }
    fn slot(kind: Kind) -> usize {
        match kind {
            Kind::F => 0,
            Kind::I => 1,
            Kind::W => 2,
            Kind::B => 3,
        }
    }
    fn get(&self, stage: usize, kind: Kind, mb: usize) -> Option<usize> {
        self.pos[Self::slot(kind)][stage * self.m + mb]
    }
    fn set(&mut self, a: Action, at: usize) {
        self.pos[Self::slot(a.kind)][a.stage * self.m + a.microbatch] = Some(at);
    }
}

/// Checks counts, duplicates and local order: every stage has one F per microbatch and one
/// backward (B, or I and W), I/B after its F, W after its I, nothing listed twice.
pub fn check_structure(schedule: &Schedule) -> Result<(), Error> {
    let seen = check_local_order(schedule)?;
    check_complete(schedule, &seen)
}

/// Walks each rank's order: nothing listed twice, each backward after what it needs.
/// Returns where each action was seen.
fn check_local_order(schedule: &Schedule) -> Result<Seen, Error> {
    let mut seen = Seen::new(schedule.stages, schedule.microbatches);
    for (rank, order) in schedule.orders.iter().enumerate() {
        for (at, &a) in order.iter().enumerate() {
            let fault = match seen.get(a.stage, a.kind, a.microbatch) {
                Some(prev) => Some(format!(
                    "duplicated: already listed at position {prev} of this rank"
                )),
                None => order_fault(schedule, &seen, a),
            };
            if let Some(reason) = fault {
                return Err(Error::Invalid {
                    rank,
                    action: Some(a),
                    reason,
                });
            }
            seen.set(a, at);
        }
    }
    Ok(seen)
}

/// Why `a` cannot run where it is, given what its rank ran before it (`seen`).
fn order_fault(schedule: &Schedule, seen: &Seen, a: Action) -> Option<String> {
    let (s, j) = (a.stage, a.microbatch);
    match a.kind {
        Kind::F => None,
        Kind::I | Kind::B => {
            let other = if a.kind == Kind::I { Kind::B } else { Kind::I };
            if seen.get(s, other, j).is_some() {
                Some(format!(
                    "microbatch {j} of stage {s} already has a backward ({}); use either B or I+W",
                    Action::new(s, other, j)
                ))
            } else if seen.get(s, Kind::F, j).is_none() {
                Some(missing_or_before(
                    schedule,
                    a,
                    Kind::F,
                    "forward",
                    "move it after the forward",
                ))
            } else {
                None
            }
        }
        Kind::W => {
            if seen.get(s, Kind::B, j).is_some() {
                Some(format!(
                    "microbatch {j} of stage {s} already ran a fused backward B, which includes W"
                ))
            } else if seen.get(s, Kind::I, j).is_none() {
                Some(missing_or_before(
                    schedule,
                    a,
                    Kind::I,
                    "input gradient",
                    "W needs what I leaves behind",
                ))
            } else {
                None
            }
        }
    }
}

/// "Runs before X" and "X is missing" are different faults; only an error looks which.
fn missing_or_before(schedule: &Schedule, a: Action, kind: Kind, what: &str, fix: &str) -> String {
    let need = Action::new(a.stage, kind, a.microbatch);
    if !schedule.orders.iter().flatten().any(|b| *b == need) {
        format!("its {what} {need} is missing: no rank runs it; add {need} before it")
    } else {
        format!("runs before its {what} {need}; {fix}")
    }
}

/// Every stage has a forward and a whole backward for every microbatch.
fn check_complete(schedule: &Schedule, seen: &Seen) -> Result<(), Error> {
    let (n, m) = (schedule.stages, schedule.microbatches);
    for s in 0..n {
        let rank = schedule.placement[s];
        if (0..m).all(|j| seen.get(s, Kind::F, j).is_none()) {
            return Err(Error::Invalid {
                rank,
                action: None,
                reason: format!("stage {s} is missing: it has no actions at all (expected {m} forwards and {m} backwards)"),
            });
        }
        for j in 0..m {
            let missing = |kind: Kind, why: &str| Error::Invalid {
                rank,
                action: Some(Action::new(s, kind, j)),
                reason: format!("missing: {why}"),
            };
            if seen.get(s, Kind::F, j).is_none() {
                return Err(missing(
                    Kind::F,
                    &format!("every stage runs a forward for each of the {m} microbatches"),
                ));
            }
            let has_i = seen.get(s, Kind::I, j).is_some();
            if !has_i && seen.get(s, Kind::B, j).is_none() {
                return Err(missing(
                    Kind::B,
                    "no backward for this microbatch (need B, or I and W)",
                ));
            }
            if has_i && seen.get(s, Kind::W, j).is_none() {
                return Err(missing(
                    Kind::W,
                    "the input gradient I ran but its weight gradient W never does",
                ));
            }
        }
    }
    Ok(())
}

/// Checks that every stage accumulates its weight gradients (W or B) in microbatch order:
/// the runtime needs this for training to be bit-identical to unpipelined training, because
/// float accumulation is not associative.
pub fn check_weight_order(schedule: &Schedule) -> Result<(), Error> {
    let mut last: Vec<Option<usize>> = vec![None; schedule.stages];
    for (rank, order) in schedule.orders.iter().enumerate() {
        for a in order.iter().filter(|a| matches!(a.kind, Kind::W | Kind::B)) {
            if let Some(prev) = last[a.stage] {
                if a.microbatch < prev {
                    return Err(Error::Invalid {
                        rank,
                        action: Some(*a),
                        reason: format!(
                            "stage {} accumulates the weight gradient of microbatch {} after microbatch {prev}; \
                             run W/B of each stage in microbatch order so training stays bit-identical",
                            a.stage, a.microbatch
                        ),
                    });
                }
            }
            last[a.stage] = Some(a.microbatch);
        }
    }
    Ok(())
}

/// Puts every stage's W passes in microbatch order without moving any slot: the k-th W of
/// a stage becomes W of its k-th smallest microbatch. Input gradients run in microbatch order
/// in every generator, so each W still follows its I, no pass can start later, and memory is
/// unchanged (every microbatch of a stage frees the same M_W).
pub fn normalize_weight_order(schedule: &mut Schedule) {
    for order in &mut schedule.orders {
        let mut per_stage: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (k, a) in order.iter().enumerate() {
            if a.kind == Kind::W {
                per_stage.entry(a.stage).or_default().push(k);
            }
        }
        for slots in per_stage.values() {
            let mut mbs: Vec<usize> = slots.iter().map(|&k| order[k].microbatch).collect();
            mbs.sort_unstable();
            for (&k, j) in slots.iter().zip(mbs) {
                order[k].microbatch = j;
            }
        }
    }
}

/// Memory held on each rank after each of its actions, in program order. Memory depends only
/// on the order (one pass at a time per rank), not on timing.
pub fn memory_trace(schedule: &Schedule, costs: &CostModel) -> Vec<Vec<f64>> {
    schedule
        .orders
        .iter()
        .map(|order| {
            let mut used = 0.0;
            order
                .iter()
                .map(|a| {
                    used += costs.mem_delta(a.stage, a.kind);
                    used
                })
                .collect()
        })
        .collect()
}

/// Peak activation memory per rank.
pub fn peak_memory(schedule: &Schedule, costs: &CostModel) -> Vec<f64> {
    memory_trace(schedule, costs)
        .iter()
        .map(|t| t.iter().copied().fold(0.0, f64::max))
        .collect()
}

/// Fails on the first action after which a rank holds more than `x` times its M_B (the
/// memory one microbatch holds on that rank after its forwards; see
/// [`CostModel::rank_mem_b`]).
pub fn check_memory(schedule: &Schedule, costs: &CostModel, x: f64) -> Result<(), Error> {
    check_limits(schedule, costs, |rank| costs.rank_limit(schedule, rank, x))
}

/// Fails on the first action after which a rank holds more than `limit(rank)`.
fn check_limits(
    schedule: &Schedule,
    costs: &CostModel,
    limit: impl Fn(usize) -> f64,
) -> Result<(), Error> {
    const EPS: f64 = 1e-9;
    for (rank, trace) in memory_trace(schedule, costs).iter().enumerate() {
        let limit = limit(rank);
        for (k, &used) in trace.iter().enumerate() {
            // Relative tolerance only: memory may be in any unit, however small.
            if used > limit * (1.0 + EPS) {
                return Err(Error::MemoryLimit {
                    rank,
                    action: schedule.orders[rank][k],
                    used,
                    limit,
                    units: limit / costs.rank_mem_b(schedule, rank).max(f64::MIN_POSITIVE),
                });
            }
        }
    }
    Ok(())
}

/// As [`check_memory`], against absolute per-rank budgets in the cost model's memory unit
/// (one entry: every rank).
pub fn check_memory_budget(
    schedule: &Schedule,
    costs: &CostModel,
    budget: &[f64],
) -> Result<(), Error> {
    check_limits(schedule, costs, |rank| {
        budget
            .get(rank)
            .or(budget.first())
            .copied()
            .unwrap_or(f64::INFINITY)
    })
}

/// Full validation: structure, deadlock freedom and (when given) the memory limit.
pub fn validate(
    schedule: &Schedule,
    costs: &CostModel,
    mem_limit: Option<f64>,
) -> Result<(), Error> {
    simulate(schedule, costs)?;
    if let Some(limit) = mem_limit {
        check_memory(schedule, costs, limit)?;
    }
    Ok(())
}
