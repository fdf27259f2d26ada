//! V schedules from a repeating building block, squeezed to a memory cap: the construction
//! of the zero-bubble authors' V-Half and V-Min (Qi et al., "Pipeline Parallelism with
//! Controllable Memory", §4; their open-source scheduler, sail-sg/zero-bubble-pipeline-
//! parallelism). Our own implementation of how it behaves, as described in
//! `docs/notes/official-schedulers.md`; none of its code is used.
//!
//! Everything happens in unit time slots. Rank i runs microbatch k's chunk-0 forward,
//! chunk-1 forward, chunk-1 input gradient and chunk-0 input gradient at fixed offsets plus
//! 6k, which leaves two free slots per period for weight gradients. The offsets decide the
//! memory (how many microbatches are in flight); the warm-up and cool-down are then
//! *squeezed*: each pass moves to the earliest free slot after its inputs that keeps the
//! rank's unit memory under the cap. Costs play no part in the order.

use super::v_shape::v_placement;
use crate::action::{Action, Kind};
use crate::schedule::Schedule;

/// Passes in unit-slot space: forwards and input gradients per chunk, and their W's.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Pass {
    F0,
    F1,
    /// The first backward: chunk 1's input gradient (rank 0 up to p−1).
    I1,
    /// The second backward: chunk 0's input gradient (rank p−1 down to 0).
    I0,
    W1,
    W0,
}

const PASSES: [Pass; 6] = [Pass::F0, Pass::F1, Pass::I1, Pass::I0, Pass::W1, Pass::W0];
/// When the squeeze starts moving cool-down passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// After the steady phase, at the last microbatch's chunk-0 forward: the authors'
    /// construction (`bench v-baseline` compares against it).
    AfterSteady,
    /// At the last microbatch's chunk-0 forward even before the steady phase begins (it
    /// does with few microbatches, m ≲ p): then there is no steady phase, and keeping those
    /// passes in their slots costs the drain (p 16, m 16, F/I/W 1/1.2/0.8: 84.0 → 79.3).
    AtLastForward,
}

/// The building blocks: slot of (F0, F1, I1, I0) of microbatch 0 on rank i of p.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Block {
    /// ⌊(p+2)/2⌋ M_B: about half of 1F1B's activations.
    Half,
    /// ⌊(p+4)/3⌋ M_B: about a third.
    Min,
}

impl Block {
    fn offsets(self, p: usize, i: usize) -> [i64; 4] {
        let (p, i) = (p as i64, i as i64);
        match self {
            Block::Min => {
                let g = if p % 3 == 0 { 2 } else { 0 };
                [i, 2 * p - 1 - i, 2 * p + g + i, 4 * p + g - 1 - i]
            }
            Block::Half => {
                let g = if p % 2 == 0 { 3 } else { 0 };
                [
                    2 * i,
                    3 * p - 2 - i,
                    3 * p + g + 2 * i - 1,
                    6 * p + g - 2 - i,
                ]
            }
        }
    }
}

/// Unit memory while walking a rank's slots: in use, owed W's, and the peak so far.
#[derive(Clone, Copy, Default)]
struct Unit {
    mem: i64,
    owed: i64,
    peak: i64,
}

impl Unit {
    fn step(mut self, e: Option<(Pass, usize)>, explicit_w: bool) -> Unit {
        match e.map(|e| e.0) {
            Some(Pass::F0 | Pass::F1) => self.mem += 1,
            Some(Pass::I0 | Pass::I1) => self.owed += 1,
            Some(Pass::W0 | Pass::W1) => self.mem -= 1,
            None if !explicit_w && self.owed > 0 => {
                self.owed -= 1;
                self.mem -= 1;
            }
            None => {}
        }
        self.peak = self.peak.max(self.mem);
        self
    }

    fn walk(self, slots: impl Iterator<Item = Option<(Pass, usize)>>, explicit_w: bool) -> Unit {
        slots.fold(self, |u, e| u.step(e, explicit_w))
    }

    /// The state before each slot, for checks that only change a suffix.
    fn prefixes(occ: &[Option<(Pass, usize)>], explicit_w: bool) -> Vec<Unit> {
        let mut u = Unit::default();
        let mut out = Vec::with_capacity(occ.len() + 1);
        for &e in occ {
            out.push(u);
            u = u.step(e, explicit_w);
        }
        out.push(u);
        out
    }
}

/// Slot of every pass: `slot[rank][pass][microbatch]`, `None` where a pass is not placed
/// (W's before they are put in).
struct Slots {
    p: usize,
    m: usize,
    slot: Vec<[Vec<Option<i64>>; 6]>,
    /// Whether a squeeze met the last microbatch's chunk-0 forward before the steady phase,
    /// where the [`Drain`] rules differ.
    drain_mattered: bool,
}

impl Slots {
    fn get(&self, d: usize, x: Pass, k: usize) -> Option<i64> {
        self.slot[d][x as usize][k]
    }

    /// The slot a pass must come after: its inputs on the neighbouring rank, the pass
    /// before it on its own rank for the same microbatch, and its predecessor microbatch.
    fn dep(&self, d: usize, x: Pass, k: usize) -> i64 {
        let p = self.p;
        let mut deps: Vec<Option<i64>> = Vec::with_capacity(3);
        match x {
            Pass::F0 => {
                if d > 0 {
                    deps.push(self.get(d - 1, Pass::F0, k));
                }
            }
            Pass::F1 => {
                deps.push(self.get(d, Pass::F0, k));
                if d + 1 < p {
                    deps.push(self.get(d + 1, Pass::F1, k));
                }
            }
            Pass::I1 => {
                deps.push(self.get(d, Pass::F1, k));
                if d > 0 {
                    deps.push(self.get(d - 1, Pass::I1, k));
                }
            }
            Pass::I0 => {
                deps.push(self.get(d, Pass::I1, k));
                if d + 1 < p {
                    deps.push(self.get(d + 1, Pass::I0, k));
                }
            }
            Pass::W1 => deps.push(self.get(d, Pass::I1, k)),
            Pass::W0 => deps.push(self.get(d, Pass::I0, k)),
        }
        if k > 0 {
            deps.push(self.get(d, x, k - 1));
        }
        deps.into_iter().flatten().max().unwrap_or(-1)
    }

    /// Rank d's placed passes in slot order.
    fn rank_order(&self, d: usize) -> Vec<(i64, Pass, usize)> {
        let mut v: Vec<(i64, Pass, usize)> = PASSES
            .iter()
            .flat_map(|&x| (0..self.m).filter_map(move |k| self.get(d, x, k).map(|s| (s, x, k))))
            .collect();
        v.sort();
        v
    }

    fn drop_w(&mut self) {
        for d in 0..self.p {
            for x in [Pass::W1, Pass::W0] {
                self.slot[d][x as usize].iter_mut().for_each(|s| *s = None);
            }
        }
    }

    /// Puts each rank's W's into its free slots in order, one per free slot, chunk 1's
    /// first; whatever is left goes after the last pass.
    fn fill_free_slots(&mut self) {
        for d in 0..self.p {
            let order = self.rank_order(d);
            let (mut q1, mut q0) = (std::collections::VecDeque::new(), Default::default());
            let q0: &mut std::collections::VecDeque<usize> = &mut q0;
            let mut at = 0;
            let mut t = order.first().map_or(0, |o| o.0);
            while at < order.len() || !q1.is_empty() || !q0.is_empty() {
                if at < order.len() && order[at].0 == t {
                    match order[at].1 {
                        Pass::I1 => q1.push_back(order[at].2),
                        Pass::I0 => q0.push_back(order[at].2),
                        _ => {}
                    }
                    at += 1;
                } else if let Some(k) = q1.pop_front() {
                    self.slot[d][Pass::W1 as usize][k] = Some(t);
                } else if let Some(k) = q0.pop_front() {
                    self.slot[d][Pass::W0 as usize][k] = Some(t);
                }
                t += 1;
            }
        }
    }

    /// Each rank's passes indexed by slot.
    fn occupancy(&self) -> Vec<Vec<Option<(Pass, usize)>>> {
        (0..self.p)
            .map(|d| {
                let order = self.rank_order(d);
                let len = order.last().map_or(0, |o| o.0 + 1) as usize;
                let mut occ = vec![None; len];
                for (s, x, k) in order {
                    occ[s as usize] = Some((x, k));
                }
                occ
            })
            .collect()
    }

    /// Peak unit memory (F +1, W −1) of a rank's slots. Without explicit W's, a free slot
    /// retires one owed W (the W's go into free slots in the end).
    fn peak(occ: &[Option<(Pass, usize)>], explicit_w: bool) -> i64 {
        Unit::default().walk(occ.iter().copied(), explicit_w).peak
    }

    /// Every pass of every rank as (slot, rank, pass, microbatch), in slot order.
    fn slot_order(&self) -> Vec<(i64, usize, Pass, usize)> {
        let mut nodes: Vec<(i64, usize, Pass, usize)> = (0..self.p)
            .flat_map(|d| {
                self.rank_order(d)
                    .into_iter()
                    .map(move |(s, x, k)| (s, d, x, k))
            })
            .collect();
        nodes.sort();
        nodes
    }

    /// Moves warm-up (unless `cooldown_only`) and cool-down passes to the earliest free
    /// slot after their inputs that keeps each rank's unit memory within its `cap`, visiting
    /// passes in slot order; the steady state keeps its slots.
    /// Returns whether the cap held any move back (if not, a larger cap squeezes alike).
    fn squeeze(
        &mut self,
        cap: &[i64],
        explicit_w: bool,
        cooldown_only: bool,
        drain: Drain,
    ) -> bool {
        let mut capped = false;
        let nodes = self.slot_order();
        let mut occ = self.occupancy();
        // With explicit W's, memory after each slot: a move shifts it by one over the
        // slots it jumps, so a check is a window maximum instead of a full recount.
        let mut level = unit_levels(&occ);
        // Without explicit W's a move changes everything after it: the state before each
        // slot is kept, so a check walks only from the new slot on.
        let mut before: Vec<Vec<Unit>> = if explicit_w {
            Vec::new()
        } else {
            occ.iter().map(|o| Unit::prefixes(o, false)).collect()
        };
        let mut phase = 0;
        for (cur, d, x, k) in nodes {
            if phase == 0 && d == 0 && x == Pass::I0 && k == 0 {
                phase = 1;
            }
            if x == Pass::F0 && k + 1 == self.m {
                // Before the steady phase the two rules part ways.
                self.drain_mattered |= phase == 0;
                if phase == 1 || drain == Drain::AtLastForward {
                    phase = 2;
                }
            }
            if !(phase == 2 || (phase == 0 && !cooldown_only)) {
                continue;
            }
            let from = (self.dep(d, x, k) + 1).max(0);
            let (c, o) = (cur as usize, &mut occ[d]);
            let fits = |o: &[Option<(Pass, usize)>], s: usize| {
                if explicit_w {
                    !matches!(x, Pass::F0 | Pass::F1)
                        || level[d][s..c].iter().copied().max().unwrap_or(0) < cap[d]
                } else {
                    let moved = (s..o.len()).map(|t| match t {
                        _ if t == s => Some((x, k)),
                        _ if t == c => None,
                        _ => o[t],
                    });
                    before[d][s].walk(moved, false).peak <= cap[d]
                }
            };
            let Some(s) = (from as usize..c).find(|&s| o[s].is_none() && fits(o, s)) else {
                // A free slot refused is one the memory cap refused.
                capped |= (from as usize..c).any(|s| o[s].is_none());
                continue;
            };
            o[c] = None;
            o[s] = Some((x, k));
            if !explicit_w {
                // Only the states from the new slot on change.
                let mut u = before[d][s];
                for t in s..o.len() {
                    before[d][t] = u;
                    u = u.step(o[t], false);
                }
                before[d][o.len()] = u;
            }
            self.slot[d][x as usize][k] = Some(s as i64);
            let shift = match x {
                Pass::F0 | Pass::F1 => 1,
                Pass::W0 | Pass::W1 => -1,
                _ => 0,
            };
            level[d][s..c].iter_mut().for_each(|l| *l += shift);
        }
        capped
    }

    /// Re-times every pass by eager unit-time execution of each rank's slot order, so the
    /// slots become dense again after a squeeze. False on a deadlock.
    fn retime(&mut self) -> bool {
        let orders: Vec<Vec<(Pass, usize)>> = (0..self.p)
            .map(|d| {
                self.rank_order(d)
                    .into_iter()
                    .map(|(_, x, k)| (x, k))
                    .collect()
            })
            .collect();
        for d in 0..self.p {
            for x in PASSES {
                self.slot[d][x as usize].iter_mut().for_each(|s| *s = None);
            }
        }
        let mut next = vec![0usize; self.p];
        let mut free = vec![0i64; self.p];
        loop {
            let mut moved = false;
            for d in 0..self.p {
                while let Some(&(x, k)) = orders[d].get(next[d]) {
                    if !self.ready(d, x, k) {
                        break;
                    }
                    let s = free[d].max(self.dep(d, x, k) + 1);
                    self.slot[d][x as usize][k] = Some(s);
                    free[d] = s + 1;
                    next[d] += 1;
                    moved = true;
                }
            }
            if (0..self.p).all(|d| next[d] == orders[d].len()) {
                return true;
            }
            if !moved {
                return false;
            }
        }
    }

    /// Whether every input of (x, k) on rank d is placed (its neighbours' passes).
    fn ready(&self, d: usize, x: Pass, k: usize) -> bool {
        let p = self.p;
        let need = match x {
            Pass::F0 if d > 0 => Some((d - 1, Pass::F0)),
            Pass::F1 if d + 1 < p => Some((d + 1, Pass::F1)),
            Pass::I1 if d > 0 => Some((d - 1, Pass::I1)),
            Pass::I0 if d + 1 < p => Some((d + 1, Pass::I0)),
            _ => None,
        };
        need.is_none_or(|(e, y)| self.get(e, y, k).is_some())
    }
}

/// One building block on a memory ladder.
struct Rung {
    block: (Block, Drain),
    /// The block's own unit peak (chunk activations).
    own: i64,
    /// The last schedule it gave.
    last: Option<Schedule>,
    /// Whether the last squeeze was held back by its cap (if not, larger caps squeeze
    /// alike and the block is done).
    capped: bool,
}

/// Both building blocks along a memory ladder: each at its own peak, and squeezed to every
/// larger cap a level allows until the cap no longer holds a move back.
pub(crate) struct BlockLadder {
    rungs: Vec<Rung>,
    p: usize,
    m: usize,
    /// Each rank's share of the limit ([`crate::cost::CostModel::rank_share`]).
    share: Vec<f64>,
}

impl BlockLadder {
    pub(crate) fn new(p: usize, m: usize, name: &str, share: Vec<f64>) -> BlockLadder {
        let mut rungs: Vec<Rung> = Vec::new();
        for block in [Block::Half, Block::Min] {
            let mut mattered = false;
            for drain in [Drain::AfterSteady, Drain::AtLastForward] {
                // With enough microbatches both drains start at the same pass: the second
                // would squeeze alike.
                if drain == Drain::AtLastForward && !mattered {
                    continue;
                }
                let Some(sq) = squeezed(p, m, (block, drain), None, name) else {
                    continue;
                };
                mattered = sq.drain_mattered;
                rungs.push(Rung {
                    block: (block, drain),
                    own: sq.own,
                    last: Some(sq.schedule),
                    capped: sq.capped,
                });
            }
        }
        BlockLadder { rungs, p, m, share }
    }

    /// The blocks squeezed to their own peaks (independent of the limit).
    pub(crate) fn own(&self) -> Vec<Schedule> {
        self.rungs.iter().filter_map(|r| r.last.clone()).collect()
    }

    /// The blocks squeezed to `x` × M_B (2x chunk activations), where that is above their own
    /// peak and the cap still held a move back.
    pub(crate) fn at(&mut self, x: f64, name: &str) -> Vec<Schedule> {
        // Chunk activations each rank may hold: 2x, times its share of the limit.
        let cap: Vec<i64> = (0..self.p)
            .map(|d| (2.0 * x * self.share.get(d).copied().unwrap_or(1.0) + 1e-9).floor() as i64)
            .collect();
        let mut out = Vec::new();
        for rung in &mut self.rungs {
            if !rung.capped || cap.iter().all(|&c| c <= rung.own) {
                continue;
            }
            match squeezed(self.p, self.m, rung.block, Some(&cap), name) {
                Some(Squeezed {
                    schedule: s,
                    capped,
                    ..
                }) => {
                    rung.capped = capped;
                    if rung.last.as_ref() != Some(&s) {
                        rung.last = Some(s.clone());
                        out.push(s);
                    }
                }
                None => rung.capped = false,
            }
        }
        out
    }

    /// Whether larger limits give nothing new.
    pub(crate) fn settled(&self) -> bool {
        self.rungs.iter().all(|r| !r.capped)
    }
}

/// A building block squeezed: the V schedule, the block's own unit peak, whether the cap
/// held a move back, and whether the other [`Drain`] rule would squeeze differently.
pub(crate) struct Squeezed {
    pub(crate) schedule: Schedule,
    own: i64,
    capped: bool,
    drain_mattered: bool,
}

/// The building block `block` for `p` ranks and `m` microbatches, its cool-down from
/// `drain`, squeezed to `cap` chunk activations per rank (at least the block's own peak), as
/// a V schedule named `name`; `None` if the squeeze deadlocks (never seen; the caller keeps
/// its other candidates).
pub(crate) fn squeezed(
    p: usize,
    m: usize,
    (block, drain): (Block, Drain),
    cap: Option<&[i64]>,
    name: &str,
) -> Option<Squeezed> {
    let mut s = Slots {
        p,
        m,
        drain_mattered: false,
        slot: (0..p)
            .map(|d| {
                let o = block.offsets(p, d);
                let mut per: [Vec<Option<i64>>; 6] = Default::default();
                for (x, off) in [Pass::F0, Pass::F1, Pass::I1, Pass::I0].into_iter().zip(o) {
                    per[x as usize] = (0..m).map(|k| Some(off + 6 * k as i64)).collect();
                }
                per[Pass::W1 as usize] = vec![None; m];
                per[Pass::W0 as usize] = vec![None; m];
                per
            })
            .collect(),
    };
    // Offsets that share a slot modulo the period would put two passes in one slot.
    for d in 0..p {
        let mut used: Vec<i64> = block
            .offsets(p, d)
            .iter()
            .map(|o| o.rem_euclid(6))
            .collect();
        used.sort();
        used.dedup();
        if used.len() < 4 || block.offsets(p, d).iter().any(|&o| o < 0) {
            return None;
        }
    }
    s.fill_free_slots();
    let own = s
        .occupancy()
        .iter()
        .map(|o| Slots::peak(o, true))
        .max()
        .unwrap_or(0);
    let cap: Vec<i64> = (0..p).map(|d| cap.map_or(own, |c| c[d].max(own))).collect();
    let mut capped = s.squeeze(&cap, true, false, drain);
    if !s.retime() {
        return None;
    }
    s.drop_w();
    capped |= s.squeeze(&cap, false, true, drain);
    s.fill_free_slots();
    let orders = (0..p)
        .map(|d| {
            let (c0, c1) = (d, 2 * p - 1 - d);
            s.rank_order(d)
                .into_iter()
                .map(|(_, x, k)| match x {
                    Pass::F0 => Action::new(c0, Kind::F, k),
                    Pass::F1 => Action::new(c1, Kind::F, k),
                    Pass::I1 => Action::new(c1, Kind::I, k),
                    Pass::I0 => Action::new(c0, Kind::I, k),
                    Pass::W1 => Action::new(c1, Kind::W, k),
                    Pass::W0 => Action::new(c0, Kind::W, k),
                })
                .collect()
        })
        .collect();
    let schedule = Schedule::new(name, 2 * p, p, m, v_placement(p), orders).ok()?;
    // A squeeze gone wrong must cost a candidate, never the plan: keep only valid orders.
    crate::validate::check_structure(&schedule).ok()?;
    let unit = crate::cost::CostModel::for_layout(
        &crate::cost::CostSpec::uniform(Default::default(), 0.0),
        2 * p,
        p,
    )
    .ok()?;
    crate::sim::span_and_makespan(&schedule, &unit)?;
    Some(Squeezed {
        schedule,
        own,
        capped,
        drain_mattered: s.drain_mattered,
    })
}

/// Each rank's unit memory after each slot, with explicit W's: +1 per forward, −1 per W.
fn unit_levels(occ: &[Vec<Option<(Pass, usize)>>]) -> Vec<Vec<i64>> {
    occ.iter()
        .map(|o| {
            let mut mem = 0;
            o.iter()
                .map(|e| {
                    match e.map(|e| e.0) {
                        Some(Pass::F0 | Pass::F1) => mem += 1,
                        Some(Pass::W0 | Pass::W1) => mem -= 1,
                        _ => {}
                    }
                    mem
                })
                .collect()
        })
        .collect()
}
