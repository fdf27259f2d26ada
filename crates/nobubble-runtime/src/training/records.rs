//! Rank 0's step records: every rank posts its share of a step ([`Report`]) without waiting,
//! and rank 0 assembles a step's record once it has that step's summary — one step late, so
//! that no rank waits for another between iterations (a step about to be saved, which
//! settles and waits anyway, at once).

use super::{fail, TrainingRun};
use crate::error::RuntimeError;
use crate::run::StepRecord;
use crate::session::median_pass_ms;
use crate::worker::{CommStats, MeasuredSlot, RankStep};
use nobubble_schedule::{Action, CostModel, Kind, RankCost};
use serde::{Deserialize, Serialize};

/// One rank's share of a step's record, posted to rank 0.
#[derive(Serialize, Deserialize)]
pub(super) struct Report {
    timeline: Vec<(usize, char, usize, f64, f64, f64)>,
    peak_bytes: usize,
    comm: CommStats,
    /// The signal this rank was asked to stop by (0: none), for rank 0 to act on.
    stop: i32,
}

impl Report {
    pub(super) fn of(r: &RankStep, stop: i32) -> Report {
        Report {
            stop,
            timeline: r
                .timeline
                .iter()
                .map(|s| {
                    (
                        s.action.stage,
                        s.action.kind.letter(),
                        s.action.microbatch,
                        s.start,
                        s.end,
                        s.waited,
                    )
                })
                .collect(),
            peak_bytes: r.peak_bytes,
            comm: r.comm,
        }
    }

    fn into_rank_step(self) -> Result<RankStep, RuntimeError> {
        let timeline = self
            .timeline
            .into_iter()
            .map(|(stage, k, mb, start, end, waited)| {
                let kind = Kind::from_letter(k).ok_or_else(|| {
                    RuntimeError::Fault(format!("damaged step report: pass kind {k}"))
                })?;
                Ok(MeasuredSlot {
                    action: Action::new(stage, kind, mb),
                    start,
                    end,
                    waited,
                })
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(RankStep {
            timeline,
            peak_bytes: self.peak_bytes,
            summary: None,
            settled: Vec::new(),
            comm: self.comm,
        })
    }
}

impl TrainingRun<'_, '_> {
    /// After the steps: settles the last post-validated step (unless a checkpoint already
    /// did) and, at rank 0, records every step, reading the last step's reports too. The
    /// job's elapsed time ends here, before the recording.
    pub(super) fn finish_steps(&mut self) -> Result<(), RuntimeError> {
        self.settle()?;
        self.elapsed = Some(self.started.elapsed().as_secs_f64());
        if self.root {
            self.record_ready(u64::MAX)?;
        }
        Ok(())
    }

    /// Settles a pending post-validated step and files every summary settled since the last
    /// step (a checkpoint export settles too).
    pub(super) fn settle(&mut self) -> Result<(), RuntimeError> {
        self.session.rank.settle()?;
        let settled = self.session.rank.take_settled();
        self.summaries
            .extend(settled.into_iter().map(|s| (s.step, s)));
        Ok(())
    }

    /// Rank 0: turns every step up to `upto` whose summary is known into a record (gathering
    /// the ranks' posted reports) and shows it.
    pub(super) fn record_ready(&mut self, upto: u64) -> Result<(), RuntimeError> {
        while let Some((step, wall, schedule)) = self.unrecorded.first().cloned() {
            if step > upto {
                break;
            }
            let Some(summary) = self.summaries.get(&step) else {
                break;
            };
            let mut remote_stop = self.remote_stop;
            let reports = self
                .session
                .rank
                .collect_reports(step)?
                .into_iter()
                .map(|b| {
                    let r = serde_json::from_slice::<Report>(&b).map_err(fail)?;
                    remote_stop = remote_stop.max(r.stop);
                    r.into_rank_step()
                })
                .collect::<Result<Vec<_>, _>>();
            self.remote_stop = remote_stop;
            let rec = StepRecord::assemble(summary, &reports?, wall);
            if let Some(o) = self.observer.as_deref_mut() {
                o.step(&rec, &schedule).map_err(RuntimeError::Observer)?;
            }
            self.records.push(rec);
            self.unrecorded.remove(0);
        }
        Ok(())
    }
}

/// Median measured pass times (ms) per stage, with the plan's memory, for simulating the
/// schedule that ran; a fused B is split in the plan's I:W proportion.
pub fn measured_costs(records: &[StepRecord], plan: &CostModel) -> CostModel {
    let medians = median_pass_ms(records, plan.stages.len());
    let stages = medians
        .into_iter()
        .zip(&plan.stages)
        .map(|([f, i, w, b], p)| {
            let f = f.unwrap_or(p.f);
            let (i, w) = match (i, w, b) {
                (Some(i), Some(w), _) => (i, w),
                (_, _, Some(b)) => {
                    let share = p.i / (p.i + p.w);
                    (b * share, b * (1.0 - share))
                }
                _ => (p.i, p.w),
            };
            RankCost {
                f,
                i: i.max(1e-6),
                w: w.max(1e-6),
                mem_b: p.mem_b,
                mem_w: p.mem_w,
                b: None,
            }
        })
        .collect();
    CostModel {
        stages,
        comm: plan.comm,
        objective: plan.objective,
        rank_share: plan.rank_share.clone(),
    }
}

/// Bytes as MiB with two decimals.
pub fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}
