//! The zero-bubble paper's automatic scheduler, as REFERENCE §4 describes it: the baseline
//! `zb-auto` is measured against (and includes among its candidates, so it is never worse).
//!
//! A greedy construction over all stages at once with *uniform* costs — the median F, I and
//! W over stages, as the official code profiles them — and the real per-stage memory (and,
//! on uneven pipelines, the same construction on each stage's own costs, as the official
//! code plans when given per-stage costs; the better of the two is kept):
//! 1. microbatch 0's forward on every stage; then, from stage p−2 down, as many warm-up
//!    forwards as end before microbatch 0's input gradient can be back (knob: one more that
//!    overshoots), at least one more than the next stage and within memory; then
//!    microbatch 0's input gradients from the last stage down;
//! 2. rounds of one forward per stage (a stage never runs further ahead of the next one
//!    than its warm-up; knob: a stage two or more forwards ahead skips its forward when it
//!    would delay the input gradient due next), then one input gradient per stage from the
//!    last stage down;
//! 3. before each F or I, weight gradients while memory would overflow (no W pending: the
//!    attempt fails), and those that fit completely in the wait (knob: any wait gets one);
//! 4. the remaining weight gradients at the end.
//!
//! All 2³ knob settings are built and the one with the shortest longest stage span under
//! the median costs (then the shortest makespan) is kept, as the paper does; and four more
//! with the official code's bubble budget (a wait longer than the stage's budget — the
//! largest idle time of any stage so far minus its own — gets a W that overruns it, and
//! stage 0 runs its pending Ws before each input gradient once its forwards are done), which
//! on some pipelines finds what the official scheduler finds and the description misses; and
//! eight more that follow the official code's own warm-up (raw arrival estimates, then later
//! stages lowered until the counts decrease) and skip rule (a stage two ahead skips when the
//! next stage's clock + F + I + comm is near enough to wait for; a skip cancels the round's
//! forward on every earlier stage), so it is never worse than the official greedy either.
//!
//! The knob setting kept is the best under the costs' objective (the official code ranks by
//! the longest span; under `--objective makespan` ours ranks by the makespan, so it is never
//! worse than the official choice on either).
//!
//! Where the description leaves details open, this implementation chooses: knob 3 stands
//! for the paper's "bubble budget" with a budget of zero (any wait may get a W that
//! overruns it); the skip knob estimates the input gradient's arrival by letting every later
//! stage run this round's forward and then that input gradient as soon as it can; a stage
//! that skipped a forward may run two in a later round to regain its warm-up lead; warm-ups
//! that already hold all m forwards may tie instead of decreasing (m < p); the median of an
//! even number of stages is the upper one.

use std::collections::VecDeque;

use super::search::{better, Score};
use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;

/// The three knobs of the paper's search.
#[derive(Clone, Copy, Debug)]
struct Knobs {
    overshoot_warmup: bool,
    skip_forward: bool,
    w_in_any_wait: bool,
    /// The official code's bubble budget: a wait longer than the stage's budget (the largest
    /// idle time of any stage so far minus its own) always gets a W that overruns it, and
    /// stage 0, once it has run all its forwards, runs every pending W before each input
    /// gradient.
    budget: bool,
}

/// The paper's heuristic on a linear placement with memory limit `x` × each stage's M_B.
/// The second value says whether memory held anything back (forced a W or capped a
/// warm-up) in any attempt: when it never did, every larger limit gives the same schedule.
pub(crate) fn zb_paper(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    name: &str,
) -> Result<(Schedule, bool), Error> {
    // On the median costs (as the official code profiles a model), and on each stage's own
    // (what it builds when handed per-stage costs: on uneven pipelines it places warm-ups,
    // skips and weight gradients where the medians would not); the better one under the
    // true costs is kept. With equal stages both are the same construction.
    let (median_times, own_times) = (Times::median(costs), Times::per_stage(costs));
    let same = median_times == own_times;
    let median = paper_search(p, m, costs, x, name, median_times);
    if same {
        return median;
    }
    let own = paper_search(p, m, costs, x, name, own_times);
    match (median, own) {
        (Ok(a), Ok(b)) => {
            let bound = a.1 || b.1;
            let (sa, sb) = (true_score(&a.0, costs)?, true_score(&b.0, costs)?);
            Ok((if better(sb, sa) { b.0 } else { a.0 }, bound))
        }
        // One construction failed at this limit: report memory as binding, so that a larger
        // limit (where it may succeed) is still tried.
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok((a.0, true)),
        (Err(e), Err(_)) => Err(e),
    }
}

/// A schedule's (longest span, makespan) simulated on the true costs, ranked by their
/// objective.
fn true_score(s: &Schedule, costs: &CostModel) -> Result<Score, Error> {
    let sim = crate::sim::simulate(s, costs)?;
    let span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
    Ok(super::search::ranked(
        (span, sim.metrics.makespan),
        costs.objective,
    ))
}

/// The knob search of [`zb_paper`] on the given planning times.
fn paper_search(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    name: &str,
    times: Times,
) -> Result<(Schedule, bool), Error> {
    let mut best: Option<(Score, Vec<Vec<Action>>)> = None;
    let mut started = Builder::new(p, m, times, costs, x);
    let plain = Knobs {
        overshoot_warmup: false,
        skip_forward: false,
        w_in_any_wait: false,
        budget: false,
    };
    let mut bound = false;
    let counts = started.start(plain).map(|()| {
        let a = started.warmup(false);
        let b = started.warmup(true);
        (a, b)
    });
    bound |= started.memory_bound;
    let official_counts = [false, true].map(|o| {
        let (count, capped) = started.official_warmup(o)?;
        bound |= capped;
        Some(count)
    });
    if let Some((without, with)) = counts {
        // The 2³ settings of the description, then the four of the official code's budget
        // mode (which replaces "no W in a wait" by "a W in a wait over budget"), then the
        // official code's own 2³: its warm-up (raw estimates, later stages lowered to keep
        // the counts decreasing) and skip rule (a crude arrival estimate; a skip cancels
        // the round's forward on every earlier stage), with budget or any-wait W's.
        for k in 0..20 {
            let official = k >= 12;
            let knobs = Knobs {
                overshoot_warmup: k & 1 != 0,
                skip_forward: k & 2 != 0,
                w_in_any_wait: (k < 8 || official) && k & 4 != 0,
                budget: k >= 8,
            };
            let count = if official {
                &official_counts[knobs.overshoot_warmup as usize]
            } else if knobs.overshoot_warmup {
                &with
            } else {
                &without
            };
            let Some(count) = count else { continue };
            // The overshoot knob changes nothing when it gives the same warm-up.
            if knobs.overshoot_warmup
                && if official {
                    official_counts[0] == official_counts[1]
                } else {
                    with == without
                }
            {
                continue;
            }
            let mut b = started.clone();
            let built = if official {
                b.finish_official(count, knobs)
            } else {
                b.finish(count, knobs)
            };
            bound |= b.memory_bound;
            if built.is_none() {
                continue;
            }
            let score = b.score();
            if best.as_ref().is_none_or(|(s, _)| better(score, *s)) {
                best = Some((score, b.order));
            }
        }
    }
    let (_, orders) = best.ok_or_else(|| {
        Error::Input(format!(
            "the paper's heuristic finds no schedule within {x} × M_B (every rank must hold \
             one microbatch's activations); use a larger --mem-limit, or zb-auto"
        ))
    })?;
    let placement: Vec<usize> = (0..p).collect();
    Ok((Schedule::new(name, p, p, m, placement, orders)?, bound))
}

/// The pass times the heuristic plans with, per stage: the median for every stage (as the
/// official code profiles a model), or each stage's own (what the official code computes
/// when it is handed per-stage costs).
#[derive(Clone, PartialEq)]
struct Times {
    f: Vec<f64>,
    i: Vec<f64>,
    w: Vec<f64>,
    comm: f64,
}

impl Times {
    /// The median F, I and W over stages, for every stage.
    fn median(costs: &CostModel) -> Self {
        let median = |get: fn(&crate::cost::RankCost) -> f64| {
            let mut v: Vec<f64> = costs.stages.iter().map(get).collect();
            v.sort_by(f64::total_cmp);
            vec![v[v.len() / 2]; v.len()]
        };
        Times {
            f: median(|c| c.f),
            i: median(|c| c.i),
            w: median(|c| c.w),
            comm: costs.comm,
        }
    }

    /// Each stage's own F, I and W.
    fn per_stage(costs: &CostModel) -> Self {
        Times {
            f: costs.stages.iter().map(|c| c.f).collect(),
            i: costs.stages.iter().map(|c| c.i).collect(),
            w: costs.stages.iter().map(|c| c.w).collect(),
            comm: costs.comm,
        }
    }
}

/// The construction's state: per stage its clock, memory, pending weight gradients and the
/// order so far, and the end time of every forward and input gradient placed.
#[derive(Clone)]
struct Builder<'a> {
    p: usize,
    m: usize,
    t: Times,
    costs: &'a CostModel,
    limit: Vec<f64>,
    clock: Vec<f64>,
    first: Vec<f64>,
    mem: Vec<f64>,
    pending: Vec<VecDeque<usize>>,
    next_f: Vec<usize>,
    next_i: Vec<usize>,
    end_f: Vec<f64>,
    end_i: Vec<f64>,
    order: Vec<Vec<Action>>,
    memory_bound: bool,
    /// Idle time of each stage since its first pass (the budget knob's measure).
    idle: Vec<f64>,
}

impl<'a> Builder<'a> {
    fn new(p: usize, m: usize, t: Times, costs: &'a CostModel, x: f64) -> Self {
        Builder {
            p,
            m,
            t,
            costs,
            limit: (0..p)
                .map(|s| x * costs.stages[s].mem_b * costs.share(s))
                .collect(),
            clock: vec![0.0; p],
            first: vec![f64::NAN; p],
            mem: vec![0.0; p],
            pending: vec![VecDeque::new(); p],
            next_f: vec![0; p],
            next_i: vec![0; p],
            end_f: vec![f64::NAN; p * m],
            end_i: vec![f64::NAN; p * m],
            order: vec![Vec::with_capacity(3 * m); p],
            memory_bound: false,
            idle: vec![0.0; p],
        }
    }

    fn ready_f(&self, s: usize, j: usize) -> f64 {
        if s == 0 {
            0.0
        } else {
            self.end_f[(s - 1) * self.m + j] + self.t.comm
        }
    }

    fn ready_i(&self, s: usize, j: usize) -> f64 {
        if s + 1 == self.p {
            self.end_f[s * self.m + j]
        } else {
            self.end_i[(s + 1) * self.m + j] + self.t.comm
        }
    }

    fn fits(&self, s: usize, delta: f64) -> bool {
        self.mem[s] + delta <= self.limit[s] * (1.0 + 1e-9) + 1e-12
    }

    fn put(&mut self, s: usize, kind: Kind, ready: f64) {
        let (j, dur) = match kind {
            Kind::F => (self.next_f[s], self.t.f[s]),
            Kind::I => (self.next_i[s], self.t.i[s]),
            _ => (
                self.pending[s].pop_front().expect("a pending W"),
                self.t.w[s],
            ),
        };
        let start = self.clock[s].max(ready);
        if self.first[s].is_nan() {
            self.first[s] = start;
        } else {
            self.idle[s] += start - self.clock[s];
        }
        self.clock[s] = start + dur;
        self.mem[s] += self.costs.mem_delta(s, kind);
        match kind {
            Kind::F => {
                self.end_f[s * self.m + j] = start + dur;
                self.next_f[s] += 1;
            }
            Kind::I => {
                self.end_i[s * self.m + j] = start + dur;
                self.next_i[s] += 1;
                self.pending[s].push_back(j);
            }
            _ => {}
        }
        self.order[s].push(Action::new(s, kind, j));
    }

    /// Weight gradients before an F or I that can start at `ready` and changes memory by
    /// `delta`: forced ones while memory would overflow, then those that fit in the wait.
    fn prepare(&mut self, s: usize, ready: f64, delta: f64, knobs: Knobs) -> Option<()> {
        while !self.fits(s, delta) {
            self.memory_bound = true;
            if self.pending[s].is_empty() {
                return None;
            }
            self.put(s, Kind::W, 0.0);
        }
        while !self.pending[s].is_empty() && self.clock[s] + self.t.w[s] <= ready + 1e-12 {
            self.put(s, Kind::W, 0.0);
        }
        if !self.pending[s].is_empty() && self.clock[s] < ready {
            let over_budget = knobs.budget && ready - self.clock[s] > self.budget(s);
            if knobs.w_in_any_wait || over_budget {
                self.put(s, Kind::W, 0.0);
            }
        }
        Some(())
    }

    /// How much more this stage may wait before a W is worth overrunning the wait: the
    /// largest idle time of any stage so far minus its own.
    fn budget(&self, s: usize) -> f64 {
        self.idle.iter().copied().fold(0.0, f64::max) - self.idle[s]
    }

    fn forward(&mut self, s: usize, knobs: Knobs) -> Option<()> {
        let ready = self.ready_f(s, self.next_f[s]);
        self.prepare(s, ready, self.costs.stages[s].mem_b, knobs)?;
        self.put(s, Kind::F, ready);
        Some(())
    }

    fn input_grad(&mut self, s: usize, knobs: Knobs) -> Option<()> {
        let ready = self.ready_i(s, self.next_i[s]);
        self.prepare(s, ready, self.costs.mem_delta(s, Kind::I), knobs)?;
        if knobs.budget && s == 0 && self.next_f[0] == self.m {
            while !self.pending[0].is_empty() {
                self.put(0, Kind::W, 0.0);
            }
        }
        self.put(s, Kind::I, ready);
        Some(())
    }

    /// Microbatch 0's forward on every stage (the same for every knob setting).
    fn start(&mut self, knobs: Knobs) -> Option<()> {
        for s in 0..self.p {
            self.forward(s, knobs)?;
        }
        Some(())
    }

    /// Warm-up forwards per stage, from stage p−2 down, on an estimate of when microbatch
    /// 0's input gradient is back (every stage runs its forwards back to back after its
    /// first). `None` if memory cannot hold a 1F1B-like warm-up.
    fn warmup(&mut self, overshoot: bool) -> Option<Vec<usize>> {
        let (p, m, t) = (self.p, self.m, self.t.clone());
        // Memory caps every warm-up, and stage s must stay one forward ahead of stage s+1
        // (unless it already runs all m forwards in its warm-up), so stage s can warm up at
        // most `allowed[s]` forwards.
        let mut allowed = vec![0usize; p];
        for s in 0..p {
            let mem_b = self.costs.stages[s].mem_b;
            let cap = if mem_b > 0.0 {
                (self.limit[s] * (1.0 + 1e-9) / mem_b).floor() as usize
            } else {
                m // activations take no memory: nothing caps the warm-up
            };
            let mut a = cap.checked_sub(1)?.min(m - 1);
            if s > 0 && allowed[s - 1] < m - 1 {
                a = a.min(allowed[s - 1].checked_sub(1)?);
            }
            allowed[s] = a;
        }
        let mut count = vec![0usize; p];
        let mut i_end = vec![0.0f64; p];
        i_end[p - 1] = self.end_f[(p - 1) * m] + t.i[p - 1];
        for s in (0..p.saturating_sub(1)).rev() {
            let arrive = i_end[s + 1] + t.comm;
            let f_end = |k: usize| self.end_f[s * m] + k as f64 * t.f[s];
            let mut k = 0;
            while k + 1 < m {
                if f_end(k + 1) <= arrive + 1e-12 {
                    k += 1;
                } else {
                    if overshoot {
                        k += 1;
                    }
                    break;
                }
            }
            k = k.max(count[s + 1] + 1).min(m - 1);
            if k > allowed[s] {
                self.memory_bound = true;
                k = allowed[s];
            }
            count[s] = k;
            i_end[s] = f_end(k).max(arrive) + t.i[s];
        }
        Some(count)
    }

    /// The warm-up forwards of these counts, then microbatch 0's input gradients from the
    /// last stage up: how both kinds of rounds start.
    fn warm_up_and_first_backward(&mut self, count: &[usize], knobs: Knobs) -> Option<()> {
        for (s, &n) in count.iter().enumerate() {
            for _ in 0..n {
                self.forward(s, knobs)?;
            }
        }
        for s in (0..self.p).rev() {
            self.input_grad(s, knobs)?;
        }
        Some(())
    }

    /// Everything after microbatch 0's forwards, with these warm-up counts.
    fn finish(&mut self, count: &[usize], knobs: Knobs) -> Option<()> {
        let (p, m, t) = (self.p, self.m, self.t.clone());
        self.warm_up_and_first_backward(count, knobs)?;
        // Rounds: one forward per stage, then one input gradient per stage going up.
        while self.next_i.iter().any(|&j| j < m) {
            let mut moved = false;
            for s in 0..p {
                // One forward per round; a stage that fell behind its warm-up lead (by a
                // skipped forward) may run a second one to catch up.
                let mut ran = 0;
                loop {
                    let j = self.next_f[s];
                    if j >= m || (s > 0 && self.next_f[s - 1] <= j) {
                        break;
                    }
                    if s + 1 < p {
                        let lead = j - self.next_f[s + 1].min(j);
                        let target = count[s] - count[s + 1];
                        // Never further ahead than the warm-up lead (+1 within a round).
                        if lead > target || (ran > 0 && lead >= target) {
                            break;
                        }
                        if knobs.skip_forward && lead >= 2 {
                            let f_end = self.clock[s].max(self.ready_f(s, j)) + t.f[s];
                            if f_end > self.next_i_arrival(s) {
                                break;
                            }
                        }
                    } else if ran > 0 {
                        break;
                    }
                    self.forward(s, knobs)?;
                    ran += 1;
                    moved = true;
                }
            }
            for s in (0..p).rev() {
                let j = self.next_i[s];
                if j >= m || j >= self.next_f[s] || (s + 1 < p && self.next_i[s + 1] <= j) {
                    continue;
                }
                self.input_grad(s, knobs)?;
                moved = true;
            }
            if !moved {
                return None;
            }
        }
        for s in 0..p {
            while !self.pending[s].is_empty() {
                self.put(s, Kind::W, 0.0);
            }
        }
        Some(())
    }

    /// When the input gradient stage `s` needs next should arrive, estimated before this
    /// round's input gradients are placed: every later stage runs this round's forward (if
    /// it has one) and then that input gradient as soon as it can. Infinite if a later stage
    /// has not yet run the forward it needs.
    fn next_i_arrival(&self, s: usize) -> f64 {
        let (p, m, t) = (self.p, self.m, self.t.clone());
        let j = self.next_i[s];
        if j >= m {
            return f64::INFINITY;
        }
        let mut arrive = f64::NAN;
        for q in (s + 1..p).rev() {
            if self.next_i[q] > j {
                // Already done: its real end is known.
                arrive = self.end_i[q * m + j] + t.comm;
                continue;
            }
            let mut free = self.clock[q];
            let mut f_end = if self.next_f[q] > j {
                self.end_f[q * m + j]
            } else {
                f64::NAN
            };
            let fj = self.next_f[q];
            if fj < m && (q == 0 || self.next_f[q - 1] > fj) {
                // This round's forward runs first.
                let ready = if q == 0 {
                    0.0
                } else {
                    self.end_f[(q - 1) * m + fj] + t.comm
                };
                free = free.max(ready) + t.f[q];
                if fj == j {
                    f_end = free;
                }
            }
            if f_end.is_nan() {
                return f64::INFINITY;
            }
            let ready = if q + 1 == p { f_end } else { arrive };
            arrive = free.max(ready) + t.i[q] + t.comm;
        }
        arrive
    }

    /// The official code's warm-up counts: from stage p−2 down, forwards back to back after
    /// the first until one would end after (or, with `overshoot`, at or after) microbatch
    /// 0's input gradient arrives, estimated from the raw counts; then later stages are
    /// lowered until the counts strictly decrease. The flag says whether memory capped a
    /// count.
    fn official_warmup(&self, overshoot: bool) -> Option<(Vec<usize>, bool)> {
        let (p, m, t) = (self.p, self.m, self.t.clone());
        let mut count = vec![0usize; p];
        let mut capped = false;
        let mut last = self.end_f[(p - 1) * m] + t.i[p - 1];
        for s in (0..p.saturating_sub(1)).rev() {
            let mem_b = self.costs.stages[s].mem_b;
            let room = if mem_b > 0.0 {
                ((self.limit[s] * (1.0 + 1e-9) - self.mem[s]) / mem_b)
                    .floor()
                    .max(0.0) as usize
            } else {
                m
            };
            let arrive = last + t.comm;
            let mut end = self.end_f[s * m];
            let mut k = 0;
            while k + 1 < m {
                let more = if overshoot {
                    end < arrive
                } else {
                    end + t.f[s] <= arrive
                };
                if !more {
                    break;
                }
                if k >= room {
                    capped = true;
                    break;
                }
                end += t.f[s];
                k += 1;
            }
            count[s] = k;
            last = end.max(arrive) + t.i[s];
        }
        for s in 1..p {
            while count[s] > 0 && count[s] >= count[s - 1] && count[s] + 1 < m {
                count[s] -= 1;
            }
        }
        Some((count, capped))
    }

    /// The official code's rounds after the warm-up: per round, each stage runs one
    /// forward unless it is two or more ahead of the next stage and the next stage's input
    /// gradient (estimated as that stage's clock + F + I + comm) is close enough to wait
    /// for; a skip cancels the round's forward on every earlier stage. Then one input
    /// gradient per stage, from the last stage up.
    fn finish_official(&mut self, count: &[usize], knobs: Knobs) -> Option<()> {
        let (p, m, t) = (self.p, self.m, self.t.clone());
        self.warm_up_and_first_backward(count, knobs)?;
        for _ in 1..m {
            let mut run: Vec<bool> = (0..p).map(|s| self.next_f[s] < m).collect();
            if knobs.skip_forward {
                for (s, go) in run.iter_mut().enumerate().take(p - 1) {
                    if !*go || self.next_f[s] < self.next_f[s + 1] + 2 {
                        continue;
                    }
                    let est = self.clock[s + 1] + t.f[s + 1] + t.i[s + 1] + t.comm;
                    *go = if self.clock[s] >= est {
                        false
                    } else if self.clock[s] + t.f[s] + self.forced_w_time(s) <= est {
                        true
                    } else {
                        est - self.clock[s] > self.budget(s)
                    };
                }
            }
            for s in (0..p.saturating_sub(1)).rev() {
                run[s] &= run[s + 1];
            }
            for (s, &go) in run.iter().enumerate() {
                if go {
                    self.forward(s, knobs)?;
                }
            }
            for s in (0..p).rev() {
                let j = self.next_i[s];
                if j >= self.next_f[s] || (s + 1 < p && self.next_i[s + 1] <= j) {
                    return None;
                }
                self.input_grad(s, knobs)?;
            }
        }
        for s in 0..p {
            while !self.pending[s].is_empty() {
                self.put(s, Kind::W, 0.0);
            }
        }
        Some(())
    }

    /// Time of the W's stage `s` must run before a forward fits in memory.
    fn forced_w_time(&self, s: usize) -> f64 {
        let mut mem = self.mem[s] + self.costs.stages[s].mem_b;
        let mut time = 0.0;
        for _ in &self.pending[s] {
            if mem <= self.limit[s] * (1.0 + 1e-9) + 1e-12 {
                break;
            }
            mem -= self.costs.stages[s].mem_w;
            time += self.t.w[s];
        }
        time
    }

    /// (longest stage span, makespan) under the uniform costs — the paper's objective —
    /// ranked as the costs' objective says.
    fn score(&self) -> Score {
        let span = (0..self.p)
            .map(|s| self.clock[s] - self.first[s])
            .fold(0.0, f64::max);
        let makespan = self.clock.iter().copied().fold(0.0, f64::max);
        super::search::ranked((span, makespan), self.costs.objective)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostSpec, RankCost};
    use crate::sim::simulate;

    fn span(p: usize, m: usize, x: f64) -> f64 {
        let spec = CostSpec::uniform(RankCost::default(), 0.0);
        let costs = CostModel::for_layout(&spec, p, p).unwrap();
        let (s, _) = zb_paper(p, m, &costs, x, "zb-paper").unwrap();
        crate::validate::check_memory(&s, &costs, x).unwrap();
        let sim = simulate(&s, &costs).unwrap();
        sim.metrics.span.iter().copied().fold(0.0, f64::max)
    }

    /// With F = I = W the paper's ZB-1p is ZB-H1 — m(F+I+W) + (p−1)(F+I−W) — and its ZB-2p
    /// has no bubble once m ≥ 2p (the paper's Table 5 shows the same).
    #[test]
    fn equal_passes_give_zb_h1_at_p_and_no_bubble_at_2p() {
        for p in [2usize, 4, 8] {
            for m in [2 * p, 3 * p] {
                let work = 3.0 * m as f64;
                assert_eq!(span(p, m, p as f64), work + (p - 1) as f64, "p={p} m={m}");
                assert_eq!(span(p, m, 2.0 * p as f64), work, "p={p} m={m}");
            }
        }
    }

    /// Below a 1F1B warm-up (p·M_B) the description's warm-up cannot start, but the
    /// official code's (memory-capped counts, forced W's) still plans: slower with every
    /// microbatch of memory taken away, and always within the limit.
    #[test]
    fn below_a_1f1b_warm_up_the_official_rules_still_plan_within_the_limit() {
        let spec = CostSpec::uniform(RankCost::default(), 0.0);
        let costs = CostModel::for_layout(&spec, 4, 4).unwrap();
        let mut last = 0.0;
        for x in [4.0, 3.0, 2.0, 1.0] {
            let (s, _) = zb_paper(4, 8, &costs, x, "zb-paper").unwrap();
            crate::validate::check_memory(&s, &costs, x).unwrap();
            let span = simulate(&s, &costs)
                .unwrap()
                .metrics
                .span
                .iter()
                .copied()
                .fold(0.0, f64::max);
            assert!(span > last, "limit {x}: span {span} after {last}");
            last = span;
        }
        // Four microbatches' work per rank back to back is the floor at limit 1.
        assert!(last >= 8.0 * 3.0);
    }
}
