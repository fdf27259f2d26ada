//! The exact event simulator: when does each action start and end?
//!
//! Each rank runs its list in order, one action at a time. An action starts when its rank is
//! free and its dependency has ended (+ `comm` when the dependency ran on another rank):
//! F(s,j) after F(s−1,j); I/B(s,j) after I/B(s+1,j), or after F(s,j) on the last stage;
//! W(s,j) after I(s,j). Because the order on every rank is fixed, these rules define the
//! times uniquely; the simulator evaluates them in one pass over the actions and reports a
//! deadlock when no rank can move.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;
use crate::validate::{check_structure, peak_memory};
use serde::Serialize;

/// One executed action on the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Slot {
    /// What ran.
    pub action: Action,
    /// When it started.
    pub start: f64,
    /// When it ended.
    pub end: f64,
    /// The cross-pass dependency that made it wait, if the rank was idle because of it.
    pub waited_for: Option<Action>,
}

/// Summary figures of one simulated iteration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metrics {
    /// End of the last action on any rank (all ranks start at 0).
    pub makespan: f64,
    /// Compute time per rank.
    pub busy: Vec<f64>,
    /// First start to last end, per rank.
    pub span: Vec<f64>,
    /// `span − busy` per rank: gaps between a rank's first and last action.
    pub idle: Vec<f64>,
    /// Peak activation memory per rank.
    pub peak_memory: Vec<f64>,
    /// `1 − max(busy)/max(span)`: the paper's measure. Right when consecutive iterations tile
    /// (post-validated optimizer step, no barrier), so a rank's own span is what it pays.
    pub bubble_rate: f64,
    /// `1 − Σ busy / (ranks · makespan)`: share of all device time left idle, start-up
    /// stagger included. Right when every iteration ends in a barrier (synchronous step).
    pub bubble_fraction: f64,
    /// Point-to-point transfers per iteration.
    pub messages: usize,
}

/// The result of simulating a schedule under a cost model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Simulation {
    /// Per rank, its actions with start and end times, in program order.
    pub timeline: Vec<Vec<Slot>>,
    /// Summary figures.
    pub metrics: Metrics,
    /// The chain of actions that determines the makespan, first to last.
    pub critical_path: Vec<Action>,
}

/// Dense per-(stage, slot, microbatch) table; slot 0 = F, 1 = I or B, 2 = W.
struct PassTable<T> {
    m: usize,
    data: Vec<T>,
}

impl<T: Copy> PassTable<T> {
    fn new(stages: usize, m: usize, init: T) -> Self {
        PassTable {
            m,
            data: vec![init; stages * m * 3],
        }
    }
    fn idx(&self, a: Action) -> usize {
        let slot = match a.kind {
            Kind::F => 0,
            Kind::I | Kind::B => 1,
            Kind::W => 2,
        };
        (a.stage * 3 + slot) * self.m + a.microbatch
    }
    fn get(&self, a: Action) -> T {
        self.data[self.idx(a)]
    }
    fn set(&mut self, a: Action, v: T) {
        let i = self.idx(a);
        self.data[i] = v;
    }
}

/// The pass `a` waits for, if any. For a backward the dependency is written as I; the
/// table maps I and B to the same slot, so a fused B upstream satisfies it too.
pub fn dependency(a: Action, stages: usize) -> Option<Action> {
    let (s, j) = (a.stage, a.microbatch);
    match a.kind {
        Kind::F if s == 0 => None,
        Kind::F => Some(Action::new(s - 1, Kind::F, j)),
        Kind::I | Kind::B if s + 1 == stages => Some(Action::new(s, Kind::F, j)),
        Kind::I | Kind::B => Some(Action::new(s + 1, Kind::I, j)),
        Kind::W => Some(Action::new(s, Kind::I, j)),
    }
}

/// Simulates one iteration. Fails on structural errors (see
/// [`check_structure`](crate::validate::check_structure)) and on deadlocks, naming the
/// cycle of waiting ranks.
pub fn simulate(schedule: &Schedule, costs: &CostModel) -> Result<Simulation, Error> {
    check_structure(schedule)?;
    if costs.stages.len() != schedule.stages {
        return Err(Error::Input(format!(
            "cost model has {} stages, schedule has {}",
            costs.stages.len(),
            schedule.stages
        )));
    }
    let mut timeline: Vec<Vec<Slot>> = schedule
        .orders
        .iter()
        .map(|o| Vec::with_capacity(o.len()))
        .collect();
    replay(schedule, costs, |r, slot| timeline[r].push(slot))
        .map_err(|pos| deadlock_cycle(schedule, &pos))?;
    let metrics = metrics(schedule, costs, &timeline);
    let critical_path = critical_path(schedule, &timeline);
    Ok(Simulation {
        timeline,
        metrics,
        critical_path,
    })
}

/// Evaluates the timing rules once over the whole schedule, handing each action's slot to
/// `visit` (with its rank) in an order that respects every dependency. On a deadlock it
/// returns how far each rank got. The one implementation behind [`simulate`] and
/// [`span_and_makespan`].
fn replay(
    schedule: &Schedule,
    costs: &CostModel,
    mut visit: impl FnMut(usize, Slot),
) -> Result<(), Vec<usize>> {
    let (n, p, m) = (schedule.stages, schedule.ranks, schedule.microbatches);
    let mut end = PassTable::new(n, m, f64::NAN);
    // Which kind filled each slot, so a wait on a fused B upstream is reported as B.
    let mut end_kind = PassTable::new(n, m, Kind::I);
    let mut clock = vec![0.0f64; p];
    let mut pos = vec![0usize; p];
    let total = schedule.len();
    let mut done = 0;
    while done < total {
        let mut progressed = false;
        for r in 0..p {
            let order = &schedule.orders[r];
            while pos[r] < order.len() {
                let a = order[pos[r]];
                let mut ready = 0.0;
                let mut dep_used = None;
                if let Some(d) = dependency(a, n) {
                    let e = end.get(d);
                    if e.is_nan() {
                        break;
                    }
                    let hop = if schedule.placement[d.stage] != r {
                        costs.comm
                    } else {
                        0.0
                    };
                    ready = e + hop;
                    dep_used = Some(d);
                }
                let start = clock[r].max(ready);
                let waited_for = if ready > clock[r] {
                    dep_used.map(|d| actual(d, &end_kind))
                } else {
                    None
                };
                let finish = start + costs.time(a.stage, a.kind);
                end.set(a, finish);
                end_kind.set(a, a.kind);
                visit(
                    r,
                    Slot {
                        action: a,
                        start,
                        end: finish,
                        waited_for,
                    },
                );
                clock[r] = finish;
                pos[r] += 1;
                done += 1;
                progressed = true;
            }
        }
        if !progressed {
            return Err(pos);
        }
    }
    Ok(())
}

/// `d` as it appears in the schedule: a backward dependency is looked up as I but may be
/// satisfied by a fused B.
fn actual(d: Action, kinds: &PassTable<Kind>) -> Action {
    Action::new(d.stage, kinds.get(d), d.microbatch)
}

/// Follows "rank r waits for an action on rank r′" from a stuck rank until a rank repeats.
fn deadlock_cycle(schedule: &Schedule, pos: &[usize]) -> Error {
    let n = schedule.stages;
    let head = |r: usize| schedule.orders[r].get(pos[r]).copied();
    let start = (0..schedule.ranks)
        .find(|&r| head(r).is_some())
        .expect("a stuck simulation has an unfinished rank");
    let mut chain: Vec<(usize, Action, Action)> = Vec::new();
    let mut r = start;
    loop {
        if let Some(k) = chain.iter().position(|&(q, _, _)| q == r) {
            return Error::Deadlock(chain.split_off(k));
        }
        let at = head(r).expect("a rank waited on is unfinished");
        let mut waits = dependency(at, n).expect("only actions with dependencies can block");
        let holder = &schedule.orders[schedule.placement[waits.stage]];
        if waits.kind == Kind::I && !holder.contains(&waits) {
            waits.kind = Kind::B;
        }
        chain.push((r, at, waits));
        r = schedule.placement[waits.stage];
    }
}

/// Busy time and span per rank, makespan, and the two bubble measures of a timeline given
/// as each rank's passes in order: the one definition shared by the simulator and by the
/// runtime's measured steps, so "measured" and "simulated" always mean the same thing.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Compute time per rank.
    pub busy: Vec<f64>,
    /// First start to last end, per rank.
    pub span: Vec<f64>,
    /// End of the last pass.
    pub makespan: f64,
    /// `1 − max(busy)/max(span)` (see [`Metrics::bubble_rate`]).
    pub bubble_rate: f64,
    /// `1 − Σ busy / (ranks · makespan)` (see [`Metrics::bubble_fraction`]).
    pub bubble_fraction: f64,
}

/// [`Timing`] of `timeline`, reading each pass's `(start, end)` with `interval`.
pub fn timing<T>(timeline: &[Vec<T>], interval: impl Fn(&T) -> (f64, f64)) -> Timing {
    let busy: Vec<f64> = timeline
        .iter()
        .map(|t| t.iter().map(|x| interval(x).1 - interval(x).0).sum())
        .collect();
    let span: Vec<f64> = timeline
        .iter()
        .map(|t| match (t.first(), t.last()) {
            (Some(a), Some(b)) => interval(b).1 - interval(a).0,
            _ => 0.0,
        })
        .collect();
    let makespan = timeline
        .iter()
        .filter_map(|t| t.last().map(|x| interval(x).1))
        .fold(0.0, f64::max);
    let max_busy = busy.iter().copied().fold(0.0, f64::max);
    let max_span = span.iter().copied().fold(0.0, f64::max);
    let ranks = timeline.len() as f64;
    // Ratios, so in any unit of time; rounding noise around zero reads as zero.
    let idle_share = |busy: f64, of: f64| {
        let x = if of > 0.0 { 1.0 - busy / of } else { 0.0 };
        if x.abs() < 1e-12 {
            0.0
        } else {
            x
        }
    };
    Timing {
        bubble_rate: idle_share(max_busy, max_span),
        bubble_fraction: idle_share(busy.iter().sum::<f64>(), ranks * makespan),
        busy,
        span,
        makespan,
    }
}

fn metrics(schedule: &Schedule, costs: &CostModel, timeline: &[Vec<Slot>]) -> Metrics {
    let t = timing(timeline, |s| (s.start, s.end));
    let idle: Vec<f64> = t.span.iter().zip(&t.busy).map(|(s, b)| s - b).collect();
    Metrics {
        makespan: t.makespan,
        bubble_rate: t.bubble_rate,
        bubble_fraction: t.bubble_fraction,
        busy: t.busy,
        span: t.span,
        idle,
        peak_memory: peak_memory(schedule, costs),
        messages: schedule.messages(),
    }
}

/// Walks back from the last action to finish: through the dependency when it made the
/// action wait, else through the previous action on the same rank.
fn critical_path(schedule: &Schedule, timeline: &[Vec<Slot>]) -> Vec<Action> {
    let m = schedule.microbatches;
    let mut where_is = PassTable::new(schedule.stages, m, (usize::MAX, 0usize));
    for (r, t) in timeline.iter().enumerate() {
        for (k, s) in t.iter().enumerate() {
            where_is.set(s.action, (r, k));
        }
    }
    let Some((mut r, mut k)) = timeline
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(r, t)| (r, t.len() - 1))
        .max_by(|a, b| {
            let (ea, eb) = (timeline[a.0][a.1].end, timeline[b.0][b.1].end);
            ea.partial_cmp(&eb).unwrap().then(b.0.cmp(&a.0))
        })
    else {
        return Vec::new();
    };
    let mut path = Vec::new();
    loop {
        let slot = timeline[r][k];
        path.push(slot.action);
        if let Some(d) = slot.waited_for {
            (r, k) = where_is.get(d);
        } else if k > 0 {
            k -= 1;
        } else {
            break;
        }
    }
    path.reverse();
    path
}

/// The two objectives a planner search needs — (longest rank span, makespan) — without
/// building a timeline. Assumes a structurally valid schedule (as generators produce);
/// returns `None` on a deadlock.
pub fn span_and_makespan(schedule: &Schedule, costs: &CostModel) -> Option<(f64, f64)> {
    let p = schedule.ranks;
    let mut first = vec![f64::NAN; p];
    let mut last = vec![0.0f64; p];
    replay(schedule, costs, |r, slot| {
        if first[r].is_nan() {
            first[r] = slot.start;
        }
        last[r] = slot.end;
    })
    .ok()?;
    let span = (0..p)
        .filter(|&r| !first[r].is_nan())
        .map(|r| last[r] - first[r])
        .fold(0.0, f64::max);
    Some((span, last.iter().copied().fold(0.0, f64::max)))
}
