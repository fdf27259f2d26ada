//! How a session's plan is made to fit memory: the user's limit on the measured bytes, and
//! the memory its machines had free after the measurement ([`machine`]).

use super::{human_bytes, plan_with, Plan, Session};
use crate::error::RuntimeError;
use crate::machine;
use nobubble_schedule::validate::peak_memory;
use nobubble_schedule::{CostModel, CostSpec, MemLimit};

impl Session {
    /// The activation bytes per rank an automatic schedule was planned within because its own
    /// plan would not have fit in the memory the machines had free, when the user gave no
    /// limit (the limit then stays for later re-plans); `None` if it was not needed.
    pub fn free_memory_limit(&self) -> Option<&[f64]> {
        self.fitted_to_free.as_deref()
    }

    /// Makes the plan fit the memory the machines had free after the measurement. If it does
    /// not, a kind that plans within a limit, given none, plans again within each rank's
    /// share of that memory ([`machine::activation_budgets`]; the least over its replicas);
    /// otherwise, or if even that plan does not fit, the check's error stands.
    pub(super) fn fit_machine_memory(
        &mut self,
        times: &[(f64, f64, f64)],
        comm: f64,
        source: &'static str,
    ) -> Result<(), RuntimeError> {
        let Err(refused) = self.check_machine_memory() else {
            return Ok(());
        };
        let opts = &self.options;
        if !opts.mem_limit.is_none() || opts.file.is_some() || !opts.kind.takes_limit() {
            return Err(refused);
        }
        let ranks = self.plan.schedule.ranks;
        let mut budgets: Vec<Option<f64>> = vec![None; ranks];
        for (r, b) in machine::activation_budgets(&self.readings_of_plan())
            .into_iter()
            .enumerate()
        {
            let least = &mut budgets[r % ranks];
            *least = match (*least, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
        // A rank no reading bounds keeps the room its current plan needs.
        let budgets: Vec<f64> = (budgets.iter().zip(&self.plan.predicted_peak))
            .map(|(b, &peak)| b.unwrap_or(peak))
            .collect();
        self.options.mem_limit = MemLimit::PerRank(budgets.clone());
        let fitted = self
            .replan_with(times, comm, source)
            .ok()
            .map(|plan| std::mem::replace(&mut self.plan, plan));
        if fitted.is_none() || self.check_machine_memory().is_err() {
            self.options.mem_limit = MemLimit::None;
            if let Some(previous) = fitted {
                self.plan = previous;
            }
            return Err(refused);
        }
        self.fitted_to_free = Some(budgets);
        Ok(())
    }

    /// The readings taken after the measurement, each with what its rank will add under the
    /// current plan: its peak activations and the optimizer state training will write.
    pub(super) fn readings_of_plan(&self) -> Vec<machine::Reading> {
        // Every rank computes every rank's need from the shared plan: the same verdict
        // everywhere, judged on the one set of readings.
        let schedule = &self.plan.schedule;
        let mut readings = self.free_after_measuring.clone();
        for (r, reading) in readings.iter_mut().enumerate() {
            reading.activations = self.plan.predicted_peak[r % schedule.ranks];
            reading.state = machine::state_bytes(&self.options, schedule, r);
        }
        readings
    }

    /// Refuses a plan whose peak activations, with the optimizer state training will write,
    /// would not fit in the memory the machines had free after the measurement
    /// ([`machine`]). At start and after each re-plan.
    pub(super) fn check_machine_memory(&self) -> Result<(), RuntimeError> {
        if self.free_after_measuring.is_empty() {
            return Ok(());
        }
        let schedule = &self.plan.schedule;
        let readings = self.readings_of_plan();
        // A limit helps a schedule that plans within one, if it leaves every rank a microbatch
        // (one fitted to the free memory already did what a limit can).
        let plans_within = self.options.file.is_none() && self.options.kind.takes_limit();
        let least = (0..schedule.ranks).map(|r| self.plan.costs.rank_mem_b(schedule, r));
        let least = least.fold(0.0, f64::max);
        let remedy = if !plans_within || self.fitted_to_free.is_some() {
            machine::Remedy::Smaller
        } else if self.options.mem_limit.is_none() {
            machine::Remedy::Limit(least)
        } else {
            machine::Remedy::LowerLimit(least)
        };
        machine::check_fits(&readings, "the plan's peak", remedy)
            .map_err(|e| RuntimeError::Plan(nobubble_schedule::Error::Input(e)))
    }

    /// `plan` with its peak predicted on what the stages really hold (`real`); where that is
    /// over the limit, the kinds that plan within a limit plan again (a few times) within
    /// what is left after the overshoot. The last plan is returned; `check_limit` judges it.
    pub(super) fn fit_real_memory(
        &self,
        mut plan: Plan,
        spec: &CostSpec,
        real: &CostModel,
        source: &'static str,
    ) -> Plan {
        let mut opts = self.options.clone();
        let current = &self.plan.schedule;
        for _ in 0..4 {
            plan.predicted_peak = peak_memory(&plan.schedule, real);
            // Judged against the user's limit, not the tightened one planned under.
            let Some(allowed) = self.options.mem_limit.allowed(&plan.schedule, real) else {
                break;
            };
            let over: Vec<f64> = (plan.predicted_peak.iter().zip(&allowed))
                .map(|(p, a)| (p - a).max(0.0))
                .collect();
            if !opts.kind.takes_limit() || over.iter().all(|&o| o <= 0.0) {
                break;
            }
            let planned_under = opts.mem_limit.per_rank(current.ranks).unwrap_or(allowed);
            let tighter = planned_under
                .iter()
                .zip(&over)
                .map(|(b, o)| b - o)
                .collect();
            opts.mem_limit = MemLimit::PerRank(tighter);
            match plan_with(&opts, spec, Some(current), source) {
                Ok(p) => plan = p,
                Err(_) => break,
            }
        }
        plan.predicted_peak = peak_memory(&plan.schedule, real);
        plan
    }

    /// Refuses a limit below one microbatch's measured activations on some rank.
    pub(super) fn check_one_microbatch_fits(&self, spec: &CostSpec) -> Result<(), RuntimeError> {
        let current = &self.plan.schedule;
        let probe = CostModel::for_schedule(spec, current).map_err(RuntimeError::Plan)?;
        let limit = &self.options.mem_limit;
        let Some(allowed) = limit.allowed(current, &probe) else {
            return Ok(());
        };
        for (r, &a) in allowed.iter().enumerate() {
            let need = probe.rank_mem_b(current, r);
            if a < need * (1.0 - 1e-9) {
                return Err(RuntimeError::Plan(nobubble_schedule::Error::setting(
                    "mem_limit",
                    format!(
                        "{limit} is below one microbatch's activations on rank {r} ({}, \
                         {need:.0}B); raise it or use a smaller microbatch or sequence",
                        human_bytes(need)
                    ),
                )));
            }
        }
        Ok(())
    }

    /// Refuses a plan whose predicted peak (on what the stages really hold) is over the limit.
    pub(super) fn check_limit(&self, plan: &Plan, real: &CostModel) -> Result<(), RuntimeError> {
        let Some(allowed) = self.options.mem_limit.allowed(&plan.schedule, real) else {
            return Ok(());
        };
        for (r, (&peak, &a)) in plan.predicted_peak.iter().zip(&allowed).enumerate() {
            if peak > a * (1.0 + 1e-9) {
                // An automatic kind already planned within the limit: only more memory helps,
                // and the message says how much.
                let raise = match self.options.mem_limit.as_multiple() {
                    Some(x) => {
                        let need = (x * peak / a * 100.0).ceil() / 100.0;
                        format!("raise the limit to {need} or more")
                    }
                    // In bytes, rounded up: a rounded size could fall short of the peak.
                    None => format!(
                        "raise rank {r}'s budget to {}B ({}) or more",
                        peak.ceil(),
                        human_bytes(peak)
                    ),
                };
                let fix = if self.fitted_to_free.is_some() {
                    "use a smaller microbatch or sequence, or more machines".to_string()
                } else if self.options.file.is_none() && self.options.kind.takes_limit() {
                    format!("{raise}, or use a smaller microbatch or sequence")
                } else {
                    format!("plan zb-auto (it plans within the limit), or {raise}")
                };
                let limit = match self.fitted_to_free {
                    Some(_) => "its share of the free memory".to_string(),
                    None => format!("the limit {}", self.options.mem_limit),
                };
                return Err(RuntimeError::Plan(nobubble_schedule::Error::setting(
                    "mem_limit",
                    format!(
                        "{} needs {} of activations on rank {r}, over {limit} ({}); {fix}",
                        self.options.schedule_name(),
                        human_bytes(peak),
                        human_bytes(a)
                    ),
                )));
            }
        }
        Ok(())
    }
}
