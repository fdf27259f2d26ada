//! A cost-aware greedy for the V placement under any memory limit: the construction of the
//! zero-bubble authors' ZB-V scheduler (Qi et al., "Pipeline Parallelism with Controllable
//! Memory"; their open-source scheduler, sail-sg/zero-bubble-pipeline-parallelism). This is
//! our own implementation of how that scheduler behaves, as described in
//! `docs/notes/official-schedulers.md`; none of its code is used.
//!
//! It builds every rank's list round by round, timing each pass as it goes: a warm-up of
//! chunk-0 forwards sized so the first chunk-1 forward arrives just in time, then 2m rounds
//! of one input gradient and at most one forward per rank. Weight gradients fill waits they
//! fit in; a wait longer than the rank's *bubble budget* (how far it may idle more than the
//! worst rank did) gets one more W even though it overruns. The budget is then re-derived
//! from the run's own per-rank idle time and the run repeated while it improves.

use super::v_shape::v_placement;
use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::schedule::Schedule;
use std::collections::VecDeque;

/// Where one rank is while the greedy builds its list.
#[derive(Clone, Default)]
struct Device {
    clock: f64,
    mem: f64,
    /// Idle time after the rank's first forward (the first forward's own wait is the
    /// pipeline's fill, common to every schedule).
    bubble: f64,
    started: bool,
    /// Forwards and input gradients run so far, per chunk.
    nf: [usize; 2],
    ni: [usize; 2],
    /// Weight gradients owed, oldest first: (chunk, microbatch).
    pending: VecDeque<(usize, usize)>,
    order: Vec<Action>,
}

/// The knob settings of one run.
#[derive(Clone, Copy)]
struct Knobs {
    /// Over-budget W before the first (chunk-1) input gradient.
    overrun_before_backward: bool,
    /// Over-budget W before a forward.
    overrun_before_forward: bool,
}

struct Greedy<'a> {
    p: usize,
    m: usize,
    costs: &'a CostModel,
    limit: Vec<f64>,
    knobs: Knobs,
    /// Extra idle time each rank is allowed (the previous run's, or none).
    allowed_idle: Option<Vec<f64>>,
    end_f: Vec<f64>,
    end_i: Vec<f64>,
    dev: Vec<Device>,
    placement: Vec<usize>,
    /// Whether the memory limit changed any decision (if not, a larger one gives the same).
    bound: bool,
}

const EPS: f64 = 1e-9;

impl<'a> Greedy<'a> {
    fn stage(&self, d: usize, chunk: usize) -> usize {
        if chunk == 0 {
            d
        } else {
            2 * self.p - 1 - d
        }
    }
    fn idx(&self, stage: usize, mb: usize) -> usize {
        stage * self.m + mb
    }

    /// When the input of `kind` of (`stage`, `mb`) is there (after the transfer), `None` when
    /// the pass it waits for has not been placed yet; `Some(-inf)` when it waits for nothing
    /// on another rank.
    fn arrival(&self, stage: usize, kind: Kind, mb: usize) -> Option<f64> {
        let n = 2 * self.p;
        let dep = match kind {
            Kind::F if stage > 0 => stage - 1,
            Kind::I if stage + 1 < n => stage + 1,
            _ => return Some(f64::NEG_INFINITY),
        };
        let end = match kind {
            Kind::F => self.end_f[self.idx(dep, mb)],
            _ => self.end_i[self.idx(dep, mb)],
        };
        if end.is_nan() {
            return None;
        }
        let v = &self.placement;
        let comm = if v[dep] == v[stage] {
            0.0
        } else {
            self.costs.comm
        };
        Some(end + comm)
    }

    fn budget(&self, d: usize) -> f64 {
        let worst = self.dev.iter().map(|x| x.bubble).fold(0.0, f64::max);
        let extra = self.allowed_idle.as_ref().map_or(0.0, |a| {
            a.iter().copied().fold(f64::NEG_INFINITY, f64::max) - a[d]
        });
        worst.max(extra)
    }

    /// Runs `kind` of the next microbatch of `chunk` (W: the oldest owed) on rank `d`.
    fn put(&mut self, d: usize, kind: Kind, chunk: usize) {
        let (chunk, mb) = match kind {
            Kind::W => self.dev[d].pending.pop_front().expect("a W is owed"),
            Kind::F => (chunk, self.dev[d].nf[chunk]),
            _ => (chunk, self.dev[d].ni[chunk]),
        };
        let stage = self.stage(d, chunk);
        let ready = match kind {
            Kind::W => f64::NEG_INFINITY,
            _ => self.arrival(stage, kind, mb).expect("input placed"),
        };
        let cost = self.costs.time(stage, kind);
        let delta = self.costs.mem_delta(stage, kind);
        let i = self.idx(stage, mb);
        let dev = &mut self.dev[d];
        let start = dev.clock.max(ready);
        if dev.started {
            dev.bubble += start - dev.clock;
        }
        dev.clock = start + cost;
        dev.mem += delta;
        dev.order.push(Action::new(stage, kind, mb));
        match kind {
            Kind::F => {
                dev.nf[chunk] += 1;
                dev.started |= chunk == 0;
                self.end_f[i] = start + cost;
            }
            Kind::I => {
                dev.ni[chunk] += 1;
                dev.pending.push_back((chunk, mb));
                self.end_i[i] = start + cost;
            }
            _ => {}
        }
    }

    fn w_cost(&self, d: usize) -> f64 {
        let (chunk, _) = self.dev[d].pending[0];
        self.costs.time(self.stage(d, chunk), Kind::W)
    }

    /// Retires owed W's until `delta` more memory fits; false if it still does not.
    fn make_room(&mut self, d: usize, delta: f64) -> bool {
        while self.dev[d].mem + delta > self.limit[d] * (1.0 + EPS) {
            self.bound = true;
            if self.dev[d].pending.is_empty() {
                return false;
            }
            self.put(d, Kind::W, 0);
        }
        true
    }

    /// Fills the wait before a pass whose input arrives at `arrival`: every W that ends by
    /// then, and with `over_budget` one more when the wait is longer than the rank may idle.
    fn fill_wait(&mut self, d: usize, arrival: f64, over_budget: bool) {
        while !self.dev[d].pending.is_empty() && arrival >= self.dev[d].clock + self.w_cost(d) {
            self.put(d, Kind::W, 0);
        }
        if over_budget
            && !self.dev[d].pending.is_empty()
            && arrival - self.dev[d].clock > self.budget(d) - self.dev[d].bubble
        {
            self.put(d, Kind::W, 0);
        }
    }

    /// Places `kind` of `chunk` on `d` with the memory and W rules; false when it cannot
    /// run yet (input missing or memory full).
    fn place(&mut self, d: usize, kind: Kind, chunk: usize, over_budget: bool) -> bool {
        let mb = match kind {
            Kind::F => self.dev[d].nf[chunk],
            _ => self.dev[d].ni[chunk],
        };
        let stage = self.stage(d, chunk);
        if mb >= self.m || (kind == Kind::I && mb >= self.dev[d].nf[chunk]) {
            return false;
        }
        let Some(arrival) = self.arrival(stage, kind, mb) else {
            return false;
        };
        if !self.make_room(d, self.costs.mem_delta(stage, kind)) {
            return false;
        }
        self.fill_wait(d, arrival, over_budget);
        self.put(d, kind, chunk);
        true
    }

    fn run(mut self) -> Option<(Schedule, Vec<f64>, bool)> {
        self.warm_up()?;
        self.fill();
        self.steady_state_and_cool_down()?;
        for d in 0..self.p {
            while !self.dev[d].pending.is_empty() {
                self.put(d, Kind::W, 0);
            }
        }
        let bubbles = self.dev.iter().map(|d| d.bubble).collect();
        let orders = self.dev.into_iter().map(|d| d.order).collect();
        // Complete by construction (the rounds end only when every input gradient ran) and
        // every pass placed after its input, so it cannot deadlock.
        let s = Schedule::new("zb-v", 2 * self.p, self.p, self.m, self.placement, orders).ok()?;
        Some((s, bubbles, self.bound))
    }

    /// Microbatch 0 down the first chunk, then each rank's chunk-0 forwards and its first
    /// chunk-1 forward (`None` if a pass cannot be placed).
    fn warm_up(&mut self) -> Option<()> {
        let (p, m) = (self.p, self.m);
        // Microbatch 0 down the first chunk.
        for d in 0..p {
            if !self.place(d, Kind::F, 0, false) {
                return None;
            }
        }
        // Warm-up: rank i runs chunk-0 forwards (and so do all ranks before it) until one
        // more would end after chunk 1's first forward comes back from rank i+1, keeping
        // room for the chunk-1 forwards still to come.
        for i in (0..p).rev() {
            if i + 1 < p {
                let back = self.end_f[self.idx(self.stage(i + 1, 1), 0)] + self.costs.comm;
                let fmem = |g: &Self, d: usize| {
                    g.costs.stages[g.stage(d, 0)]
                        .mem_b
                        .max(g.costs.stages[g.stage(d, 1)].mem_b)
                };
                loop {
                    let dev = &self.dev[i];
                    let f = self.costs.time(self.stage(i, 0), Kind::F);
                    let room = (0..=i).all(|j| {
                        self.dev[j].nf[0] < m
                            && self.dev[j].mem + fmem(self, j) <= self.limit[j] * (1.0 + EPS)
                    });
                    let late = dev.clock + f > back + EPS * back.abs().max(1.0);
                    // Before its first backward rank i still runs its chunk-1 forward of
                    // microbatch 0 and, in the fill below, i more pairs of forwards: keep
                    // room for those 2i + 1 and this one.
                    let full = !room
                        || dev.mem + (2 + 2 * i) as f64 * fmem(self, i)
                            > self.limit[i] * (1.0 + EPS);
                    if late || full {
                        self.bound |= full && !late;
                        break;
                    }
                    // `room` guarantees every rank 0..=i can take this forward.
                    let placed = (0..=i).all(|j| self.place(j, Kind::F, 0, false));
                    if !placed {
                        return None;
                    }
                }
            }
            if !self.place(i, Kind::F, 1, false) {
                return None;
            }
        }
        Some(())
    }

    /// Each rank catches up with the one before it, alternating chunks.
    fn fill(&mut self) {
        let (p, m) = (self.p, self.m);
        let mut chunk = 0;
        for i in 1..p {
            let mut idle = 0;
            loop {
                let (a, b) = (&self.dev[i], &self.dev[i - 1]);
                let behind = a.nf[0] + a.nf[1] < b.nf[0] + b.nf[1];
                let turn = a.nf[1] <= b.nf[1] && b.nf[1] < m;
                if !(behind || turn) || idle >= 2 {
                    break;
                }
                let mut any = false;
                for j in (i..p).rev() {
                    any |= self.place(j, Kind::F, chunk, false);
                }
                idle = if any { 0 } else { idle + 1 };
                chunk ^= 1;
            }
        }
    }

    /// One input gradient and at most one forward per rank per round, until every input
    /// gradient ran (`None` if two rounds in a row place nothing).
    fn steady_state_and_cool_down(&mut self) -> Option<()> {
        let (p, m) = (self.p, self.m);
        let mut stuck = 0;
        while self.dev.iter().any(|d| d.ni[0] + d.ni[1] < 2 * m) {
            let mut progress = false;
            let second: Vec<bool> = (0..p)
                .map(|d| {
                    let x = &self.dev[d];
                    x.ni[1] > x.ni[0]
                        && (d + 1 == p
                            || !self.end_i[self.idx(self.stage(d + 1, 0), x.ni[0])].is_nan()
                            || x.ni[1] == m)
                })
                .collect();
            for d in (0..p).rev().filter(|&d| second[d]) {
                progress |= self.place(d, Kind::I, 0, true);
            }
            for d in (0..p).filter(|&d| !second[d]) {
                progress |= self.place(d, Kind::I, 1, self.knobs.overrun_before_backward);
            }
            for d in 0..p {
                let x = &self.dev[d];
                let ready = |g: &Self, c: usize| {
                    let mb = g.dev[d].nf[c];
                    mb < m && g.arrival(g.stage(d, c), Kind::F, mb).is_some()
                };
                let c = if x.nf[1] >= x.nf[0] {
                    Some(0)
                } else if d + 1 == p || ready(self, 1) {
                    Some(1)
                } else if ready(self, 0) {
                    Some(0)
                } else {
                    None
                };
                if let Some(c) = c.filter(|&c| ready(self, c)) {
                    progress |= self.place(d, Kind::F, c, self.knobs.overrun_before_forward);
                }
            }
            stuck = if progress { 0 } else { stuck + 1 };
            if stuck > 1 {
                return None;
            }
        }
        Some(())
    }
}

/// The greedy's schedules for `p` ranks and `m` microbatches under `x` × each rank's M_B:
/// every knob setting, each re-run on its own per-rank idle times while the worst rank's
/// idle time shrinks. Runs that cannot fit the limit are left out. The flag says whether
/// the limit shaped any run (if not, every larger limit gives the same schedules).
pub(crate) fn candidates(p: usize, m: usize, costs: &CostModel, x: f64) -> (Vec<Schedule>, bool) {
    let placement = v_placement(p);
    let limit: Vec<f64> = (0..p)
        .map(|d| {
            x * costs.share(d)
                * (0..2 * p)
                    .filter(|&s| placement[s] == d)
                    .map(|s| costs.stages[s].mem_b)
                    .sum::<f64>()
        })
        .collect();
    let mut out = Vec::new();
    let mut bound = false;
    // The authors' scheduler plans with one median time per pass over all chunks; with
    // uneven stages that can beat planning on the real times, so both run.
    let median = median_times(costs);
    let models: &[&CostModel] = if median == *costs {
        &[costs]
    } else {
        &[costs, &median]
    };
    for (model, overrun_before_backward, overrun_before_forward) in models.iter().flat_map(|&c| {
        [(false, false), (true, false), (false, true), (true, true)].map(|(b, f)| (c, b, f))
    }) {
        let mut allowed_idle = None;
        let mut worst = f64::INFINITY;
        // Each re-run is one pass over p·m; a few suffice (the idle times settle quickly).
        let reruns = if p * m <= 1024 { 8 } else { 3 };
        for _ in 0..reruns {
            let g = Greedy {
                p,
                m,
                costs: model,
                limit: limit.clone(),
                knobs: Knobs {
                    overrun_before_backward,
                    overrun_before_forward,
                },
                allowed_idle: allowed_idle.clone(),
                end_f: vec![f64::NAN; 2 * p * m],
                end_i: vec![f64::NAN; 2 * p * m],
                dev: vec![Device::default(); p],
                placement: placement.clone(),
                bound: false,
            };
            let Some((s, bubbles, b)) = g.run() else {
                bound = true;
                break;
            };
            bound |= b;
            let w = bubbles.iter().copied().fold(0.0, f64::max);
            out.push(s);
            if w >= worst * (1.0 - 1e-12) {
                break;
            }
            worst = w;
            allowed_idle = Some(bubbles);
        }
    }
    (out, bound)
}

/// `costs` with every stage's F, I and W replaced by the (upper) median over stages.
fn median_times(costs: &CostModel) -> CostModel {
    let median = |get: fn(&crate::cost::RankCost) -> f64| {
        let mut v: Vec<f64> = costs.stages.iter().map(get).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, i, w) = (median(|c| c.f), median(|c| c.i), median(|c| c.w));
    let mut out = costs.clone();
    for c in &mut out.stages {
        (c.f, c.i, c.w) = (f, i, w);
    }
    out
}

/// [`candidates`] along a memory ladder, remembered once the limit stopped shaping them.
#[derive(Default)]
pub(crate) struct GreedyLadder {
    unbound: Option<Vec<Schedule>>,
}

impl GreedyLadder {
    /// The greedy's schedules at `x` × M_B.
    pub(crate) fn at(&mut self, p: usize, m: usize, costs: &CostModel, x: f64) -> Vec<Schedule> {
        if let Some(s) = &self.unbound {
            return s.clone();
        }
        let (s, bound) = candidates(p, m, costs, x);
        if !bound {
            self.unbound = Some(s.clone());
        }
        s
    }

    /// Whether larger limits give nothing new.
    pub(crate) fn settled(&self) -> bool {
        self.unbound.is_some()
    }
}
