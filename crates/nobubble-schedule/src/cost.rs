//! What each pass costs in time and memory.
//!
//! One convention everywhere, so schedules compare on the same model: a [`RankCost`]
//! describes one rank's share of the model (one 1F1B stage). A schedule that puts `v`
//! stages on each rank (interleaved, V shapes) gives each of its stages `1/v` of that time
//! and memory. [`CostModel::for_schedule`] applies the rule.

use crate::action::Kind;
use crate::error::Error;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

/// Time and activation memory of one rank's share of the model.
///
/// Times are in whatever unit the user picks (µs in the paper). Memory follows the paper:
/// F adds `mem_b`, I changes it by `mem_w − mem_b`, W frees `mem_w`, B frees `mem_b`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankCost {
    /// Forward time.
    pub f: f64,
    /// Input-gradient time.
    pub i: f64,
    /// Weight-gradient time.
    pub w: f64,
    /// Fused-backward time (a `B` pass), when it differs from `i + w`: a runtime that splits
    /// the backward may pay for it (PyTorch's split backward re-walks the autograd graph), so
    /// schedules that fuse it can be the faster ones. Missing means `i + w`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<f64>,
    /// Memory a microbatch holds after F (M_B).
    #[serde(default = "one")]
    pub mem_b: f64,
    /// Memory a microbatch still holds after I, until W (M_W).
    #[serde(default = "half")]
    pub mem_w: f64,
}

/// Largest time or memory value accepted: keeps every sum over a schedule finite.
pub const MAX_VALUE: f64 = 1e15;

/// Smallest nonzero time or memory value accepted: keeps every ratio of two values finite
/// and their sums exact enough (a subnormal time of 1e-320 planned three times worse).
pub const MIN_VALUE: f64 = 1e-15;

/// Whether `v` is a value the planner takes: zero (if `zero_ok`) or from [`MIN_VALUE`] to
/// [`MAX_VALUE`].
pub(crate) fn in_range(v: f64, zero_ok: bool) -> bool {
    (zero_ok && v == 0.0) || (MIN_VALUE..=MAX_VALUE).contains(&v)
}

/// A number for a message: plain, or in exponent form when huge or tiny.
fn show(v: f64) -> String {
    if v.abs() >= 1e9 || (v != 0.0 && v.abs() < 1e-6) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn one() -> f64 {
    1.0
}
fn half() -> f64 {
    0.5
}

impl Default for RankCost {
    /// F = I = W = 1, M_B = 1, M_W = 0.5: the paper's unit setting.
    fn default() -> Self {
        RankCost {
            f: 1.0,
            i: 1.0,
            w: 1.0,
            mem_b: 1.0,
            mem_w: 0.5,
            b: None,
        }
    }
}

impl RankCost {
    fn scaled(&self, k: f64) -> RankCost {
        RankCost {
            f: self.f * k,
            i: self.i * k,
            w: self.w * k,
            mem_b: self.mem_b * k,
            mem_w: self.mem_w * k,
            b: self.b.map(|b| b * k),
        }
    }

    /// Time of a fused backward: `b` when given, else `i + w`.
    pub fn fused_backward(&self) -> f64 {
        self.b.unwrap_or(self.i + self.w)
    }

    /// Whether fusing the backward saves time (`b` below `i + w`).
    pub fn fusing_saves(&self) -> bool {
        self.fused_backward() < self.i + self.w
    }

    /// The costs the lower bounds reason on, valid whether each backward runs split or fused:
    /// the input gradient leaves after `min(i, b)` and the backward's work is
    /// `min(i + w, b)`. Unchanged when `b` is missing or at least `i + w`.
    pub fn relaxed_for_bounds(&self) -> RankCost {
        let backward = self.fused_backward().min(self.i + self.w);
        let i = self.i.min(backward);
        RankCost {
            i,
            w: backward - i,
            b: None,
            ..*self
        }
    }

    /// Two consecutive pieces of the model as one: times and memory add.
    pub(crate) fn plus(self, other: RankCost) -> RankCost {
        RankCost {
            f: self.f + other.f,
            i: self.i + other.i,
            w: self.w + other.w,
            mem_b: self.mem_b + other.mem_b,
            mem_w: self.mem_w + other.mem_w,
            b: (self.b.is_some() || other.b.is_some())
                .then(|| self.fused_backward() + other.fused_backward()),
        }
    }

    fn check(&self, what: &str) -> Result<(), Error> {
        for (name, v) in [("f", self.f), ("i", self.i), ("w", self.w)] {
            if !in_range(v, false) {
                return Err(Error::Input(format!(
                    "{what}: time `{name}` must be a positive number from {MIN_VALUE:e} to \
                     {MAX_VALUE:e}, got {}",
                    show(v)
                )));
            }
        }
        if let Some(b) = self.b {
            if !in_range(b, false) {
                return Err(Error::Input(format!(
                    "{what}: fused-backward time `b` must be a positive number from \
                     {MIN_VALUE:e} to {MAX_VALUE:e}, got {} (leave it out to mean i + w)",
                    show(b)
                )));
            }
        }
        for (name, v) in [("mem_b", self.mem_b), ("mem_w", self.mem_w)] {
            if !in_range(v, true) {
                return Err(Error::Input(format!(
                    "{what}: memory `{name}` must be zero, or from {MIN_VALUE:e} to \
                     {MAX_VALUE:e}, got {}",
                    show(v)
                )));
            }
        }
        if self.mem_w > self.mem_b {
            return Err(Error::Input(format!(
                "{what}: mem_w ({}) is larger than mem_b ({}); what a microbatch keeps for W \
                 is part of what it held after F",
                self.mem_w, self.mem_b
            )));
        }
        Ok(())
    }
}

/// Costs as the user describes them, in model order: one entry for all, one per 1F1B stage
/// (the model in p consecutive parts), or one per schedule stage — plus the transfer time. This is the `--costs FILE.json` format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostSpec {
    /// Time of one transfer between stages on different ranks.
    #[serde(default)]
    pub comm: f64,
    /// One entry (all alike), one per 1F1B stage, or one per schedule stage, in model order.
    pub stages: Vec<RankCost>,
}

impl CostSpec {
    /// Same cost on every rank.
    pub fn uniform(cost: RankCost, comm: f64) -> CostSpec {
        CostSpec {
            comm,
            stages: vec![cost],
        }
    }

    /// Reads the `--costs` JSON file format (see the README).
    pub fn from_json(text: &str) -> Result<CostSpec, Error> {
        // A byte-order mark (some editors write one) is not part of the JSON.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let spec: CostSpec = serde_json::from_str(text).map_err(|e| {
            Error::Input(format!(
                "costs file: {e}; expected {{\"comm\": C, \"stages\": [{{\"f\": .., \"i\": .., \"w\": .., \"mem_b\": .., \"mem_w\": ..}}, ...]}} (optionally \"b\": the fused backward's time)"
            ))
        })?;
        spec.check()?;
        Ok(spec)
    }

    /// Rejects non-positive times, negative memory and an empty list.
    pub fn check(&self) -> Result<(), Error> {
        if self.stages.is_empty() {
            return Err(Error::Input(
                "costs: `stages` is empty; give one entry for all stages or one per stage".into(),
            ));
        }
        if !in_range(self.comm, true) {
            return Err(Error::Input(format!(
                "costs: comm must be zero, or from {MIN_VALUE:e} to {MAX_VALUE:e}, got {}",
                show(self.comm)
            )));
        }
        for (k, c) in self.stages.iter().enumerate() {
            c.check(&format!("costs entry {k}"))?;
        }
        Ok(())
    }
}

/// What the automatic planners minimize: the time an iteration really costs depends on how
/// iterations follow each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The longest rank span (first pass to last), then the makespan: what an iteration
    /// costs when iterations tile, each rank starting the next as soon as it is done (the
    /// paper's objective; post-validated optimizer steps).
    #[default]
    Span,
    /// The makespan, then the longest span: what an iteration costs when a synchronous
    /// optimizer step waits for every rank before the next iteration starts.
    Makespan,
}

impl Objective {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Span => "span",
            Objective::Makespan => "makespan",
        }
    }
}

/// Per-stage costs resolved for one schedule; what the simulator reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Cost of each schedule stage (already divided by chunks per rank).
    pub stages: Vec<RankCost>,
    /// Transfer time between stages on different ranks (zero on the same rank).
    pub comm: f64,
    /// What planners using these costs minimize (the simulator ignores it).
    #[serde(default)]
    pub objective: Objective,
    /// Each rank's share of a memory limit of `x` × M_B (1 where missing): rank r may hold
    /// `x × rank_share[r]` × its M_B. How per-rank byte budgets reach planners that climb a
    /// single ladder of multiples (see [`crate::generate::Request::mem_limit`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_share: Vec<f64>,
}

impl CostModel {
    /// Resolves a [`CostSpec`] for `schedule`, applying the one-rank's-share rule:
    /// with `v = stages / ranks`, stage `s` gets `1/v` of entry `⌊s / v⌋` when the spec has
    /// one entry per rank, or its own entry, unscaled, when the spec lists every stage; a
    /// spec that lists `k` model chunks, a multiple of the stages, gives each stage the sum of
    /// its `k / stages` consecutive chunks (so one profile of 2p chunks prices both the
    /// linear and the V layout).
    pub fn for_schedule(spec: &CostSpec, schedule: &Schedule) -> Result<CostModel, Error> {
        CostModel::for_layout(spec, schedule.stages, schedule.ranks)
    }

    /// As [`CostModel::for_schedule`], for a schedule still to be built with `n` stages on
    /// `p` ranks (stage `s` belongs to 1F1B stage `⌊s·p/n⌋` of the model).
    pub fn for_layout(spec: &CostSpec, n: usize, p: usize) -> Result<CostModel, Error> {
        spec.check()?;
        let v = n as f64 / p as f64;
        let stages = match spec.stages.len() {
            1 => vec![spec.stages[0].scaled(1.0 / v); n],
            k if k == n => spec.stages.clone(),
            k if k == p => (0..n)
                .map(|s| spec.stages[s * p / n].scaled(1.0 / v))
                .collect(),
            // Finer than the layout (e.g. 2p model chunks for a linear pipeline): each stage
            // is `k / n` consecutive chunks, their times and memory summed.
            k if k % n == 0 => spec
                .stages
                .chunks(k / n)
                .map(|group| group.iter().copied().reduce(RankCost::plus).expect("k > 0"))
                .collect(),
            k if n == p => {
                return Err(Error::Input(format!(
                    "the costs list {k} stages but this schedule has {n} (one per rank): give \
                     1 entry for all, {n}, or a multiple of {n} (consecutive model chunks summed \
                     into each stage)"
                )))
            }
            k => {
                return Err(Error::Input(format!(
                    "the costs list {k} stages but this schedule has {p} ranks and {n} stages: \
                     give 1 entry for all, {p} (the model in {p} consecutive parts, in model \
                     order, each split evenly over the {} stages it becomes — under a V not \
                     one per rank), {n}, or a multiple of {n} (consecutive model chunks summed \
                     into each stage)",
                    n / p
                )))
            }
        };
        Ok(CostModel {
            stages,
            comm: spec.comm,
            objective: Objective::default(),
            rank_share: Vec::new(),
        })
    }

    /// The same costs, planned for `objective`.
    pub fn with_objective(mut self, objective: Objective) -> CostModel {
        self.objective = objective;
        self
    }

    /// Duration of `kind` on `stage`.
    pub fn time(&self, stage: usize, kind: Kind) -> f64 {
        let c = &self.stages[stage];
        match kind {
            Kind::F => c.f,
            Kind::I => c.i,
            Kind::W => c.w,
            Kind::B => c.fused_backward(),
        }
    }

    /// Memory change caused by `kind` on `stage` (paper convention).
    pub fn mem_delta(&self, stage: usize, kind: Kind) -> f64 {
        let c = &self.stages[stage];
        match kind {
            Kind::F => c.mem_b,
            Kind::I => c.mem_w - c.mem_b,
            Kind::W => -c.mem_w,
            Kind::B => -c.mem_b,
        }
    }

    /// M_B of a rank's whole share: what one microbatch holds on `rank` after all its
    /// forwards there. `--mem-limit X` means `X` times this, per rank.
    pub fn rank_mem_b(&self, schedule: &Schedule, rank: usize) -> f64 {
        self.placed_mem_b(&schedule.placement, rank)
    }

    /// [`CostModel::rank_mem_b`] from a placement alone (the rank of each stage), for the
    /// bounds and the exact search, which have no schedule.
    pub fn placed_mem_b(&self, placement: &[usize], rank: usize) -> f64 {
        placement
            .iter()
            .zip(&self.stages)
            .filter(|(&r, _)| r == rank)
            .map(|(_, c)| c.mem_b)
            .sum()
    }

    /// `rank`'s share of a memory limit (see [`CostModel::rank_share`]).
    pub fn share(&self, rank: usize) -> f64 {
        self.rank_share.get(rank).copied().unwrap_or(1.0)
    }

    /// What `rank` may hold under a limit of `x` × M_B: `x` × its M_B × its share.
    pub fn rank_limit(&self, schedule: &Schedule, rank: usize, x: f64) -> f64 {
        self.placed_limit(&schedule.placement, rank, x)
    }

    /// [`CostModel::rank_limit`] from a placement alone.
    pub fn placed_limit(&self, placement: &[usize], rank: usize, x: f64) -> f64 {
        x * self.placed_mem_b(placement, rank) * self.share(rank)
    }

    /// Shares ([`CostModel::rank_share`]) under which a multiple of M_B on this layout
    /// (`placement`) means the bytes it means on `linear`, the one-stage-per-rank layout of
    /// the same model: how `zb-auto` compares a V plan with a linear one at the same bytes
    /// per rank. Empty when every rank's M_B is the same on both.
    pub fn shares_of_linear(&self, placement: &[usize], linear: &CostModel) -> Vec<f64> {
        let shares: Vec<f64> = (0..linear.stages.len())
            .map(|r| {
                let here = self.placed_mem_b(placement, r);
                if here > 0.0 {
                    linear.stages[r].mem_b / here
                } else {
                    1.0
                }
            })
            .collect();
        if shares.iter().all(|s| (s - 1.0).abs() <= 1e-12) {
            Vec::new()
        } else {
            shares
        }
    }

    /// The costs the lower bounds reason on ([`RankCost::relaxed_for_bounds`]), when some
    /// stage's fused backward is cheaper than its split one; `None` when nothing changes.
    pub(crate) fn relaxed_for_bounds(&self) -> Option<CostModel> {
        self.stages
            .iter()
            .any(RankCost::fusing_saves)
            .then(|| CostModel {
                stages: self
                    .stages
                    .iter()
                    .map(RankCost::relaxed_for_bounds)
                    .collect(),
                ..self.clone()
            })
    }

    /// Sum of all pass times a rank must execute per microbatch with split backward passes;
    /// the busy time of any such schedule is `m` times this, whatever the order (a fused B
    /// costs `b` instead of `i + w`).
    pub fn work_per_microbatch(&self, schedule: &Schedule, rank: usize) -> f64 {
        schedule
            .stages_of(rank)
            .iter()
            .map(|&s| self.stages[s].f + self.stages[s].i + self.stages[s].w)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: f64) -> RankCost {
        RankCost {
            f: k,
            i: 2.0 * k,
            w: 3.0 * k,
            mem_b: 4.0 * k,
            mem_w: k,
            b: None,
        }
    }

    /// A profile of 2p model chunks prices the V layout chunk by chunk and the linear one
    /// with neighbouring chunks summed: the same model either way.
    #[test]
    fn model_chunks_sum_into_coarser_stages() {
        let spec = CostSpec {
            comm: 0.5,
            stages: (1..=4).map(|k| entry(k as f64)).collect(),
        };
        let v = CostModel::for_layout(&spec, 4, 2).unwrap();
        assert_eq!(v.stages, spec.stages);
        let linear = CostModel::for_layout(&spec, 2, 2).unwrap();
        assert_eq!(linear.stages, vec![entry(3.0), entry(7.0)]);
        let total = |c: &CostModel| c.stages.iter().map(|s| s.f + s.i + s.w).sum::<f64>();
        assert_eq!(total(&v), total(&linear));
        // Not a multiple of the stages, not one per rank: refused, saying what fits.
        let e = CostModel::for_layout(&spec, 3, 3).unwrap_err().to_string();
        assert!(
            e.contains("costs list 4 stages") && e.contains("a multiple of 3"),
            "{e}"
        );
    }
}
