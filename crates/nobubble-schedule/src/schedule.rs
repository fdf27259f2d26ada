//! The schedule IR: who runs what, in which order.

use crate::action::{Action, Kind};
use crate::error::Error;
use serde::{Deserialize, Serialize};

/// A complete pipeline schedule for one training iteration.
///
/// Only the *order* of actions per rank is fixed here; timing is the simulator's job and
/// depends on a [`crate::CostModel`]. Keeping the two apart is what lets the same schedule be
/// simulated, validated, exported and executed for real.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Generator name (`1f1b`, `zb-h2`, ...) or `custom` for imported files.
    pub name: String,
    /// Number of pipeline stages (model slices); `ranks × chunks` for multi-chunk placements.
    pub stages: usize,
    /// Number of devices executing the schedule.
    pub ranks: usize,
    /// Microbatches per iteration.
    pub microbatches: usize,
    /// `placement[stage]` = the rank that holds that stage.
    pub placement: Vec<usize>,
    /// `orders[rank]` = the actions that rank executes, in program order.
    pub orders: Vec<Vec<Action>>,
}

/// Most ranks a schedule may have: beyond any real pipeline (and `train`'s limit too). The
/// bounds and the reports cost ranks × stages, so a typo's extra digits are refused at once
/// rather than planned for minutes.
pub const MAX_RANKS: usize = 4096;

/// Most stages a schedule may have (4 chunks per rank at [`MAX_RANKS`]).
pub const MAX_STAGES: usize = 4 * MAX_RANKS;

/// Refuses more than [`MAX_RANKS`] ranks or [`MAX_STAGES`] stages, naming the fix.
pub fn check_size(ranks: usize, stages: usize) -> Result<(), Error> {
    if ranks > MAX_RANKS {
        return Err(Error::Input(format!(
            "{ranks} ranks is more than the planner handles ({MAX_RANKS}); is a digit too many?"
        )));
    }
    if stages > MAX_STAGES {
        return Err(Error::Input(format!(
            "{stages} stages is more than the planner handles ({MAX_STAGES}); use fewer ranks \
             or chunks"
        )));
    }
    Ok(())
}

impl Schedule {
    /// Builds a schedule and checks only that its shape is self-consistent (placement length,
    /// ranks in range, each action listed on the rank holding its stage). Full checking of
    /// counts, dependencies and deadlocks is [`crate::validate`]'s job.
    pub fn new(
        name: impl Into<String>,
        stages: usize,
        ranks: usize,
        microbatches: usize,
        placement: Vec<usize>,
        orders: Vec<Vec<Action>>,
    ) -> Result<Schedule, Error> {
        let s = Schedule {
            name: name.into(),
            stages,
            ranks,
            microbatches,
            placement,
            orders,
        };
        s.check_shape()?;
        Ok(s)
    }

    /// Stages per rank (1 for GPipe/1F1B/ZB-H*, v for interleaved, 2 for V shapes), as a
    /// float so costs split evenly even for odd placements read from files.
    pub fn chunks_per_rank(&self) -> f64 {
        self.stages as f64 / self.ranks as f64
    }

    /// Total number of actions over all ranks.
    pub fn len(&self) -> usize {
        self.orders.iter().map(Vec::len).sum()
    }

    /// True when no rank has any action (never the case for a generated schedule).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank holding `stage`.
    pub fn rank_of(&self, stage: usize) -> usize {
        self.placement[stage]
    }

    /// The stages held by `rank`, ascending.
    pub fn stages_of(&self, rank: usize) -> Vec<usize> {
        (0..self.stages)
            .filter(|&s| self.placement[s] == rank)
            .collect()
    }

    /// Point-to-point transfers per iteration: every activation crossing a rank boundary
    /// going forward and every gradient crossing one going back. Local hand-offs (the turn of
    /// a V schedule) are free and not counted.
    pub fn messages(&self) -> usize {
        let crossings = (1..self.stages)
            .filter(|&s| self.placement[s] != self.placement[s - 1])
            .count();
        2 * crossings * self.microbatches
    }

    /// Whether the backward of this schedule is split (uses I/W) rather than fused (B).
    pub fn uses_split_backward(&self) -> bool {
        self.orders.iter().flatten().any(|a| a.kind == Kind::I)
    }

    /// Parses the JSON form written by `plan --format json`'s `schedule` field or by
    /// `serde_json::to_string(&schedule)`.
    pub fn from_json(text: &str) -> Result<Schedule, Error> {
        let s: Schedule = serde_json::from_str(text)
            .map_err(|e| Error::Input(format!("not a schedule JSON: {e}")))?;
        s.check_shape()?;
        Ok(s)
    }

    /// Checks what the validator and the simulator index by before they run: sizes within
    /// the planner's, a placement and an order per stage and rank, every action's stage,
    /// microbatch and rank in range. A schedule from outside (JSON, a pickled plan) passes
    /// here first.
    pub fn check_shape(&self) -> Result<(), Error> {
        if self.stages == 0 || self.ranks == 0 || self.microbatches == 0 {
            return Err(Error::Input(format!(
                "a schedule needs at least one stage, rank and microbatch (got stages={}, ranks={}, microbatches={})",
                self.stages, self.ranks, self.microbatches
            )));
        }
        check_size(self.ranks, self.stages)?;
        let max = crate::generate::MAX_ACTIONS;
        if (self.stages.saturating_mul(self.microbatches)).saturating_mul(3) > max {
            return Err(Error::Input(format!(
                "{} stages × {} microbatches is more than the planner handles ({max} passes); \
                 is a digit too many?",
                self.stages, self.microbatches
            )));
        }
        if self.placement.len() != self.stages {
            return Err(Error::Input(format!(
                "placement lists {} stages but the schedule has {}",
                self.placement.len(),
                self.stages
            )));
        }
        if self.orders.len() != self.ranks {
            return Err(Error::Input(format!(
                "the schedule has {} ranks but lists orders for {}",
                self.ranks,
                self.orders.len()
            )));
        }
        if let Some((s, &r)) = self
            .placement
            .iter()
            .enumerate()
            .find(|(_, &r)| r >= self.ranks)
        {
            return Err(Error::Input(format!(
                "stage {s} is placed on rank {r}, but there are only {} ranks",
                self.ranks
            )));
        }
        for (rank, order) in self.orders.iter().enumerate() {
            for a in order {
                if a.stage >= self.stages {
                    return Err(Error::Invalid {
                        rank,
                        action: Some(*a),
                        reason: format!(
                            "stage {} does not exist (stages 0..{})",
                            a.stage, self.stages
                        ),
                    });
                }
                if a.microbatch >= self.microbatches {
                    return Err(Error::Invalid {
                        rank,
                        action: Some(*a),
                        reason: format!(
                            "microbatch {} does not exist (microbatches 0..{})",
                            a.microbatch, self.microbatches
                        ),
                    });
                }
                if self.placement[a.stage] != rank {
                    return Err(Error::Invalid {
                        rank,
                        action: Some(*a),
                        reason: format!(
                            "stage {} is placed on rank {}, not on this rank",
                            a.stage, self.placement[a.stage]
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
