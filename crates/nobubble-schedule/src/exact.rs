//! An exact reference for small pipelines, on any placement (linear or V): the minimum
//! makespan over every schedule that runs each pass kind in microbatch order on each stage
//! (the order bit-identical training needs anyway), found by branch and bound. Tests use it
//! to check how close `zb-auto` and the V schedules get, and that the lower bounds never
//! exceed a proven optimum.
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
    /// Rank of each stage.
    placement: &'a [usize],
    m: usize,
    costs: &'a CostModel,
    /// Memory each rank may hold (infinite without a limit).
    limit: Vec<f64>,
    /// Per stage: the next F, I and W microbatch.
    next: Vec<[usize; 3]>,
    end_f: Vec<f64>,
    end_i: Vec<f64>,
    /// Per rank: when it is free, what it holds, the work it still owes, its passes so far.
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
        placement: &'a [usize],
        m: usize,
        costs: &'a CostModel,
        limit: Vec<f64>,
        upper: f64,
        node_limit: u64,
    ) -> Self {
        let (n, ranks) = (placement.len(), limit.len());
        let mut remaining = vec![0.0; ranks];
        for (s, &r) in placement.iter().enumerate() {
            let st = &costs.stages[s];
            remaining[r] += m as f64 * (st.f + st.i + st.w);
        }
        Search {
            placement,
            m,
            costs,
            limit,
            next: vec![[0; 3]; n],
            end_f: vec![f64::NAN; n * m],
            end_i: vec![f64::NAN; n * m],
            clock: vec![0.0; ranks],
            mem: vec![0.0; ranks],
            remaining,
            orders: vec![Vec::new(); ranks],
            best: upper + 1e-9,
            best_orders: None,
            nodes: 0,
            node_limit,
        }
    }

    /// The hop between two stages: communication when they sit on different ranks.
    fn comm(&self, from: usize, to: usize) -> f64 {
        if self.placement[from] != self.placement[to] {
            self.costs.comm
        } else {
            0.0
        }
    }

    /// Passes whose dependency is scheduled and that fit in memory: (rank, kind, earliest
    /// start, duration).
    fn candidates(&self) -> Vec<(usize, Kind, f64, f64)> {
        let (n, m) = (self.placement.len(), self.m);
        let mut out = Vec::new();
        for s in 0..n {
            let r = self.placement[s];
            let [nf, ni, nw] = self.next[s];
            let st = &self.costs.stages[s];
            let fits = |d: f64| self.mem[r] + d <= self.limit[r] * (1.0 + 1e-9);
            if nf < m && fits(st.mem_b) {
                let ready = if s == 0 {
                    Some(0.0)
                } else {
                    let e = self.end_f[(s - 1) * m + nf];
                    (!e.is_nan()).then(|| e + self.comm(s - 1, s))
                };
                if let Some(ready) = ready {
                    out.push((s, Kind::F, self.clock[r].max(ready), st.f));
                }
            }
            if ni < nf && fits(st.mem_w - st.mem_b) {
                let e = if s + 1 == n {
                    self.end_f[s * m + ni]
                } else {
                    self.end_i[(s + 1) * m + ni]
                };
                if !e.is_nan() {
                    let hop = if s + 1 == n { 0.0 } else { self.comm(s + 1, s) };
                    out.push((s, Kind::I, self.clock[r].max(e + hop), st.i));
                }
            }
            if nw < ni {
                out.push((s, Kind::W, self.clock[r], st.w));
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
        let lb = (0..self.clock.len())
            .map(|r| self.clock[r] + self.remaining[r])
            .fold(0.0, f64::max);
        lb < self.best - 1e-9
    }

    /// Runs `kind` of stage `s` from `start`; returns what [`Search::undo`] needs.
    fn apply(&mut self, s: usize, kind: Kind, start: f64, dur: f64) -> (usize, f64) {
        let (m, r) = (self.m, self.placement[s]);
        let slot = slot(kind);
        let j = self.next[s][slot];
        let end = start + dur;
        let saved_clock = self.clock[r];
        self.next[s][slot] += 1;
        match kind {
            Kind::F => self.end_f[s * m + j] = end,
            Kind::I => self.end_i[s * m + j] = end,
            _ => {}
        }
        self.clock[r] = end;
        self.mem[r] += self.costs.mem_delta(s, kind);
        self.remaining[r] -= dur;
        self.orders[r].push(Action::new(s, kind, j));
        (j, saved_clock)
    }

    fn undo(&mut self, s: usize, kind: Kind, dur: f64, (j, saved_clock): (usize, f64)) {
        let (m, r) = (self.m, self.placement[s]);
        self.orders[r].pop();
        self.remaining[r] += dur;
        self.mem[r] -= self.costs.mem_delta(s, kind);
        self.clock[r] = saved_clock;
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
        let Some(r_star) = cands
            .iter()
            .min_by(|a, b| (a.2 + a.3).total_cmp(&(b.2 + b.3)))
            .map(|c| self.placement[c.0])
        else {
            return;
        };
        let t_star = cands
            .iter()
            .map(|c| c.2 + c.3)
            .fold(f64::INFINITY, f64::min);
        let mut conflict: Vec<(usize, Kind, f64, f64)> = cands
            .into_iter()
            .filter(|c| self.placement[c.0] == r_star && c.2 < t_star - 1e-12)
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
            let r = self.placement[s];
            if start < last.0 - 1e-12 || (start <= last.0 + 1e-12 && r < last.1) {
                continue;
            }
            let undo = self.apply(s, kind, start, dur);
            self.semi_active(done + 1, total, (start, r));
            self.undo(s, kind, dur, undo);
        }
    }

    fn result(self, upper: f64) -> Exact {
        let proven = self.nodes <= self.node_limit;
        let (n, ranks) = (self.placement.len(), self.clock.len());
        let placement = self.placement.to_vec();
        let better = self
            .best_orders
            .and_then(|o| Schedule::new("exact", n, ranks, self.m, placement, o).ok());
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

/// The minimum makespan for `placement` (the rank of each stage; `costs` per stage) and `m`
/// microbatches, searching at most `node_limit` nodes from the incumbent makespan `upper`
/// (e.g. a heuristic's). With `proven`, no schedule beats `makespan`.
///
/// Without a memory limit (`x = None`) it searches active schedules only, which is exact for
/// the makespan. Under a limit of `x` × each rank's M_B (the paper's memory model; each
/// rank's share on `costs` applies) active schedules do not suffice — holding a forward back
/// until a W frees memory can be what the optimum does — so it enumerates every semi-active
/// schedule, as its passes sorted by start time, each once, cut by each rank's remaining
/// work and memory: for a dozen or so passes per rank.
///
/// It schedules split backward passes (I and W) only: with a fused backward cheaper than
/// `i + w` (`RankCost::b`) a plan with B passes may beat its optimum.
pub fn min_makespan(
    placement: &[usize],
    m: usize,
    costs: &CostModel,
    x: Option<f64>,
    upper: f64,
    node_limit: u64,
) -> Exact {
    let ranks = placement.iter().copied().max().map_or(0, |r| r + 1);
    let limit = (0..ranks)
        .map(|r| x.map_or(f64::INFINITY, |x| costs.placed_limit(placement, r, x)))
        .collect();
    let mut search = Search::new(placement, m, costs, limit, upper, node_limit);
    // Nothing can beat the proven lower bound: no search needed when the incumbent meets it.
    if upper > crate::bound::lower_bound(placement, m, costs, x) + 1e-9 {
        let total = 3 * placement.len() * m;
        match x {
            None => search.active(0, total),
            Some(_) => search.semi_active(0, total, (f64::NEG_INFINITY, 0)),
        }
    }
    search.result(upper)
}
