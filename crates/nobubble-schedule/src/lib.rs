//! Pipeline-parallel schedules: an IR, generators for the classic and zero-bubble
//! schedules, an exact event simulator, a validator, and exports.
//!
//! The flow is always the same: [`generate`] (or read a file) → [`Schedule`] →
//! [`CostModel::for_schedule`] → [`simulate`] → [`Simulation`] → an export. Nothing here
//! knows about tensors; the runtime executes the same [`Schedule`] for real.

pub mod action;
pub mod bound;
pub mod cost;
pub mod error;
pub mod exact;
pub mod export;
pub mod flops;
pub mod forecast;
pub mod generate;
pub mod limit;
pub mod paper;
pub mod planner;
mod scale;
pub mod schedule;
pub mod sim;
pub mod split;
pub mod validate;

pub use action::{Action, Kind};
pub use bound::{lower_bound, span_lower_bound};
pub use cost::{CostModel, CostSpec, Objective, RankCost};
pub use error::Error;
pub use generate::{generate, OwnLayout, Placement, Request, ScheduleKind};
pub use limit::MemLimit;
pub use planner::{plan, PlanCosts, PlanRequest, Planned};
pub use schedule::Schedule;
pub use sim::{simulate, timing, Metrics, Simulation, Slot, Timing};
pub use validate::{check_memory, check_structure, check_weight_order, validate};
