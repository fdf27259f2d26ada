//! An exact reference for small pipelines: the minimum makespan over every schedule that
//! runs each pass kind in microbatch order on each stage (the order bit-identical training
//! needs anyway), found by branch and bound. Tests use it to check how close `zb-auto` gets.
//!
//! The search builds *active* schedules (Giffler–Thompson): at each step it finds the pass
//! that could finish first, and branches only over the passes of that rank that could start
//! before that moment. For makespan, some active schedule is optimal, so the search is exact.
//! Branches are cut when a rank's clock plus its remaining work cannot beat the incumbent.
//! No memory limit there (memory depends on order, which this argument does not cover);
//! [`min_makespan_within`] enumerates every semi-active schedule instead, under a limit.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::schedule::Schedule;

/// The result of an exact search.
#[derive(Clone, Debug)]
pub struct Exact {
    /// A schedule better than the incumbent, if one exists (the best found).
    pub better: Option<Schedule>,
    /// The best makespan: the better schedule's, or the incumbent's.
    pub makespan: f64,
    /// Search nodes visited.
    pub nodes: u64,
    /// Whether the search finished, so `makespan` is proven optimal.
    pub proven: bool,
}

struct Search<'a> {
    p: usize,
    m: usize,
    costs: &'a CostModel,
    /// Memory each rank may hold (infinite without a limit).
    limit: Vec<f64>,
    next: Vec<[usize; 3]>,
    end_f: Vec<f64>,
    end_i: Vec<f64>,
    clock: Vec<f64>,
    mem: Vec<f64>,
    remaining: Vec<f64>,
    orders: Vec<Vec<Action>>,
    best: f64,
    best_orders: Option<Vec<Vec<Action>>>,
    nodes: u64,
    node_limit: u64,
}

impl<'a> Search<'a> {
    fn new(
        p: usize,
        m: usize,
        costs: &'a CostModel,
        limit: Vec<f64>,
        upper: f64,
        node_limit: u64,
    ) -> Self {
        Search {
            p,
            m,
            costs,
            limit,
            next: vec![[0; 3]; p],
            end_f: vec![f64::NAN; p * m],
            end_i: vec![f64::NAN; p * m],
            clock: vec![0.0; p],
            mem: vec![0.0; p],
            remaining: (0..p)
                .map(|s| m as f64 * (costs.stages[s].f + costs.stages[s].i + costs.stages[s].w))
                .collect(),
            orders: vec![Vec::new(); p],
            best: upper + 1e-9,
            best_orders: None,
            nodes: 0,
            node_limit,
        }
    }

    fn comm(&self, from: usize, to: usize) -> f64 {
        if from != to {
            self.costs.comm
        } else {
            0.0
        }
    }

    /// Passes whose dependency is scheduled and that fit in memory: (rank, kind, earliest
    /// start, duration).
    fn candidates(&self) -> Vec<(usize, Kind, f64, f64)> {
        let (p, m) = (self.p, self.m);
        let mut out = Vec::new();
        for s in 0..p {
            let [nf, ni, nw] = self.next[s];
            let st = &self.costs.stages[s];
            let fits = |d: f64| self.mem[s] + d <= self.limit[s] * (1.0 + 1e-9);
            if nf < m && fits(st.mem_b) {
                let ready = if s == 0 {
                    Some(0.0)
                } else {
                    let e = self.end_f[(s - 1) * m + nf];
                    (!e.is_nan()).then(|| e + self.comm(s - 1, s))
                };
                if let Some(r) = ready {
                    out.push((s, Kind::F, self.clock[s].max(r), st.f));
                }
            }
            if ni < nf && fits(st.mem_w - st.mem_b) {
                let e = if s + 1 == p {
                    self.end_f[s * m + ni]
                } else {
                    self.end_i[(s + 1) * m + ni]
                };
                if !e.is_nan() {
                    let hop = if s + 1 == p { 0.0 } else { self.comm(s + 1, s) };
                    out.push((s, Kind::I, self.clock[s].max(e + hop), st.i));
                }
            }
            if nw < ni {
                out.push((s, Kind::W, self.clock[s], st.w));
            }
        }
        out
    }

    /// Counts a node; false once the budget is spent, or when a complete schedule was
    /// recorded, or when no completion can beat the incumbent.
    fn visit(&mut self, done: usize, total: usize) -> bool {
        self.nodes += 1;
        if self.nodes > self.node_limit {
            return false;
        }
        if done == total {
            let makespan = self.clock.iter().copied().fold(0.0, f64::max);
            if makespan < self.best - 1e-9 {
                self.best = makespan;
                self.best_orders = Some(self.orders.clone());
            }
            return false;
        }
        // Bound: every rank must still do its remaining work after its clock.
        let lb = (0..self.p)
            .map(|r| self.clock[r] + self.remaining[r])
            .fold(0.0, f64::max);
        lb < self.best - 1e-9
    }

    /// Runs `kind` on rank `s` from `start`; returns what [`Search::undo`] needs.
    fn apply(&mut self, s: usize, kind: Kind, start: f64, dur: f64) -> (usize, f64) {
        let m = self.m;
        let slot = slot(kind);
        let j = self.next[s][slot];
        let end = start + dur;
        let saved_clock = self.clock[s];
        self.next[s][slot] += 1;
        match kind {
            Kind::F => self.end_f[s * m + j] = end,
            Kind::I => self.end_i[s * m + j] = end,
            _ => {}
        }
        self.clock[s] = end;
        self.mem[s] += self.costs.mem_delta(s, kind);
        self.remaining[s] -= dur;
        self.orders[s].push(Action::new(s, kind, j));
        (j, saved_clock)
    }

    fn undo(&mut self, s: usize, kind: Kind, dur: f64, (j, saved_clock): (usize, f64)) {
        let m = self.m;
        self.orders[s].pop();
        self.remaining[s] += dur;
        self.mem[s] -= self.costs.mem_delta(s, kind);
        self.clock[s] = saved_clock;
        match kind {
            Kind::F => self.end_f[s * m + j] = f64::NAN,
            Kind::I => self.end_i[s * m + j] = f64::NAN,
            _ => {}
        }
        self.next[s][slot(kind)] -= 1;
    }

    /// Active schedules only (Giffler–Thompson): enough for the makespan without memory.
    fn active(&mut self, done: usize, total: usize) {
        if !self.visit(done, total) {
            return;
        }
        let cands = self.candidates();
        let Some(&(r_star, _, _, _)) = cands
            .iter()
            .min_by(|a, b| (a.2 + a.3).total_cmp(&(b.2 + b.3)))
        else {
            return;
        };
        let t_star = cands
            .iter()
            .map(|c| c.2 + c.3)
            .fold(f64::INFINITY, f64::min);
        let mut conflict: Vec<(usize, Kind, f64, f64)> = cands
            .into_iter()
            .filter(|c| c.0 == r_star && c.2 < t_star - 1e-12)
            .collect();
        // Critical-path passes first: they tend to find good incumbents early.
        conflict.sort_by_key(|c| match c.1 {
            Kind::I => 0,
            Kind::F => 1,
            _ => 2,
        });
        for (s, kind, start, dur) in conflict {
            let undo = self.apply(s, kind, start, dur);
            self.active(done + 1, total);
            self.undo(s, kind, dur, undo);
        }
    }

    /// Every semi-active schedule, as its passes in start order (ties by rank), so each
    /// once: what a memory limit needs.
    fn semi_active(&mut self, done: usize, total: usize, last: (f64, usize)) {
        if !self.visit(done, total) {
            return;
        }
        for (s, kind, start, dur) in self.candidates() {
            if start < last.0 - 1e-12 || (start <= last.0 + 1e-12 && s < last.1) {
                continue;
            }
            let undo = self.apply(s, kind, start, dur);
            self.semi_active(done + 1, total, (start, s));
            self.undo(s, kind, dur, undo);
        }
    }

    fn result(self, upper: f64) -> Exact {
        let proven = self.nodes <= self.node_limit;
        let (p, m) = (self.p, self.m);
        let better = self
            .best_orders
            .and_then(|o| Schedule::new("exact", p, p, m, (0..p).collect(), o).ok());
        Exact {
            makespan: if better.is_some() { self.best } else { upper },
            better,
            nodes: self.nodes,
            proven,
        }
    }
}

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::F => 0,
        Kind::I => 1,
        _ => 2,
    }
}

/// Minimum makespan on a linear placement (stage s on rank s), searching at most
/// `node_limit` nodes, starting from the incumbent makespan `upper` (e.g. a heuristic's).
/// With `proven`, no schedule beats `makespan`.
pub fn min_makespan(p: usize, m: usize, costs: &CostModel, upper: f64, node_limit: u64) -> Exact {
    let mut search = Search::new(p, m, costs, vec![f64::INFINITY; p], upper, node_limit);
    // Nothing can beat the proven lower bound: no search needed when the incumbent meets it.
    let placement: Vec<usize> = (0..p).collect();
    if upper > crate::bound::lower_bound(&placement, m, costs, None) + 1e-9 {
        search.active(0, 3 * p * m);
    }
    search.result(upper)
}

/// The minimum makespan on a linear placement under a memory limit of `x` × each rank's
/// M_B (the paper's memory model), for tiny pipelines: every schedule that runs each pass
/// kind in microbatch order, enumerated as its passes sorted by start time (each
/// semi-active schedule exactly once), cut by each rank's remaining work and memory. Active
/// schedules do not suffice here — holding a forward back until a W frees memory can be
/// what the optimum does — so this enumerates more than [`min_makespan`] and is for p·m of
/// a dozen or so. `upper` is an incumbent makespan (e.g. a heuristic's).
pub fn min_makespan_within(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    upper: f64,
    node_limit: u64,
) -> Exact {
    let limit = (0..p)
        .map(|s| x * costs.stages[s].mem_b * costs.share(s))
        .collect();
    let mut search = Search::new(p, m, costs, limit, upper, node_limit);
    let placement: Vec<usize> = (0..p).collect();
    if upper > crate::bound::lower_bound(&placement, m, costs, Some(x)) + 1e-9 {
        search.semi_active(0, 3 * p * m, (f64::NEG_INFINITY, 0));
    }
    search.result(upper)
}
