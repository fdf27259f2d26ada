//! The layer split as part of the plan: how many transformer blocks each stage holds.
//!
//! A model's first stage also holds the embedding and its last the LM head and loss; with a
//! large vocabulary those unbalance an even split (Yeung et al., *Balancing Pipeline
//! Parallelism with Vocabulary Parallelism*, MLSys 2025). Given per-layer costs, the search
//! plans a few splits and keeps the one whose schedule is best under the request's
//! objective: the even split, the split that balances each stage's work (a linear-partition
//! DP), and single-block moves across stage boundaries from the best of those while they
//! improve (which also finds what a V placement's pairing of stages d and 2p−1−d wants).

use crate::cost::{CostModel, CostSpec, RankCost};
use crate::error::Error;
use crate::generate::search::better;
use crate::generate::{
    generate_as_given, OwnLayout, Placement, Request, ScheduleKind, V_CHOICE_MAX_ACTIONS,
};
use crate::limit::MemLimit;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

/// Most transformer blocks a split is planned for: beyond any model (the largest have a few
/// hundred), and the split's exact search costs stages × blocks².
pub const MAX_BLOCKS: usize = 2048;

/// A model's layers in order, for [`plan_split`]: the `--layer-costs FILE.json` format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCosts {
    /// Time of one transfer between ranks.
    #[serde(default)]
    pub comm: f64,
    /// Token and position embedding: always on the first stage.
    pub embedding: RankCost,
    /// Every transformer block, in order; or leave it out and give `block` and `count`.
    #[serde(default)]
    pub blocks: Vec<RankCost>,
    /// One block's costs, repeated `count` times (instead of `blocks`).
    #[serde(default)]
    pub block: Option<RankCost>,
    /// How many blocks `block` stands for.
    #[serde(default)]
    pub count: usize,
    /// Final norm, LM head and loss: always on the last stage.
    pub head: RankCost,
}

impl LayerCosts {
    /// Reads the JSON format, checking every entry.
    pub fn from_json(text: &str) -> Result<LayerCosts, Error> {
        let l: LayerCosts =
            serde_json::from_str(text).map_err(|e| Error::Input(format!("layer costs: {e}")))?;
        let blocks = l.blocks()?;
        // Each entry on its own (a stage's sum could hide a negative one); zero times are
        // fine for a layer (an embedding's W), not for a whole stage.
        let named = [("embedding", &l.embedding), ("head", &l.head)]
            .into_iter()
            .chain(blocks.iter().map(|b| ("a block", b)));
        for (what, c) in named {
            let ok = [c.f, c.i, c.w, c.mem_b, c.mem_w]
                .iter()
                .all(|v| crate::cost::in_range(*v, true));
            if !ok || c.mem_w > c.mem_b {
                return Err(Error::Input(format!(
                    "layer costs: {what} needs times and memory of zero, or from 1e-15 to \
                     1e15, and mem_w no larger than mem_b; got {c:?}"
                )));
            }
        }
        Ok(l)
    }

    /// The blocks in order, from either form.
    pub fn blocks(&self) -> Result<Vec<RankCost>, Error> {
        let n = self.count.max(self.blocks.len());
        if n > MAX_BLOCKS {
            return Err(Error::Input(format!(
                "layer costs: {n} blocks is more than the planner splits into stages \
                 ({MAX_BLOCKS}; the split's search grows as their square); is the count mistyped?"
            )));
        }
        let blocks = match (&self.block, self.blocks.is_empty()) {
            (Some(b), true) if self.count > 0 => vec![*b; self.count],
            (None, false) if self.count == 0 => self.blocks.clone(),
            _ => {
                return Err(Error::Input(
                    "layer costs: give either `blocks` (a list) or `block` with `count` ≥ 1".into(),
                ))
            }
        };
        // Zero times are allowed here (an embedding's W, say), so check sums in `spec`.
        Ok(blocks)
    }

    /// The stage costs of a split: `counts[s]` blocks on stage s, the embedding on stage 0
    /// and the head on the last, summed (the spec's one-entry-per-stage form).
    pub fn spec(&self, counts: &[usize]) -> Result<CostSpec, Error> {
        let blocks = self.blocks()?;
        if counts.iter().sum::<usize>() != blocks.len() {
            return Err(Error::Input(format!(
                "a split of {} blocks does not cover the model's {}",
                counts.iter().sum::<usize>(),
                blocks.len()
            )));
        }
        let add = |a: RankCost, b: &RankCost| a.plus(*b);
        let zero = RankCost {
            f: 0.0,
            i: 0.0,
            w: 0.0,
            mem_b: 0.0,
            mem_w: 0.0,
            b: None,
        };
        let mut at = 0;
        let n = counts.len();
        let stages = counts
            .iter()
            .enumerate()
            .map(|(s, &c)| {
                let mut cost = blocks[at..at + c].iter().fold(zero, add);
                at += c;
                if s == 0 {
                    cost = add(cost, &self.embedding);
                }
                if s + 1 == n {
                    cost = add(cost, &self.head);
                }
                cost
            })
            .collect();
        let spec = CostSpec {
            comm: self.comm,
            stages,
        };
        spec.check()?;
        Ok(spec)
    }
}

/// A split planned.
#[derive(Clone)]
struct Candidate {
    counts: Vec<usize>,
    schedule: Schedule,
    spec: CostSpec,
    score: (f64, f64),
    /// The bytes per rank it was checked against (empty: none).
    budget: Vec<f64>,
}

/// The split chosen and what it planned.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Blocks per stage (chunk), in model order.
    pub counts: Vec<usize>,
    /// The schedule planned on it.
    pub schedule: Schedule,
    /// The per-stage costs of the split.
    pub spec: CostSpec,
    /// The even split's schedule, for comparison (`None` if it does not plan, e.g. over a
    /// byte budget).
    pub even: Option<Schedule>,
    /// The bytes per rank the split was held to (empty: no limit): a budget given in memory
    /// as given, a multiple of M_B as the bytes it means under the even split. A multiple of
    /// the chosen split's own M_B would be another limit, so the plan is judged against these.
    pub budget: Vec<f64>,
}

/// `blocks` spread over `n` stages as evenly as possible, extra blocks to the middle stages
/// first (the runtime's even layout: the edges hold the embedding and the head).
pub fn even_counts(blocks: usize, n: usize) -> Vec<usize> {
    let mut counts = vec![blocks / n; n];
    let order: Vec<usize> = (1..n.saturating_sub(1)).chain([0, n - 1]).collect();
    for &i in order.iter().take(blocks % n) {
        counts[i] += 1;
    }
    counts
}

/// Work (F + I + W) of a cost entry.
fn work(c: &RankCost) -> f64 {
    c.f + c.i + c.w
}

/// The contiguous split minimizing the largest stage work (F + I + W, embedding and head
/// included): an exact DP over prefix counts. Middle stages keep at least `min_middle`
/// blocks.
fn balanced_counts(l: &LayerCosts, n: usize, min_middle: usize) -> Result<Vec<usize>, Error> {
    let blocks = l.blocks()?;
    let b = blocks.len();
    let prefix: Vec<f64> = std::iter::once(0.0)
        .chain(blocks.iter().scan(0.0, |s, c| {
            *s += work(c);
            Some(*s)
        }))
        .collect();
    let stage = |s: usize, from: usize, to: usize| {
        let mut w = prefix[to] - prefix[from];
        if s == 0 {
            w += work(&l.embedding);
        }
        if s + 1 == n {
            w += work(&l.head);
        }
        w
    };
    // best[s][k]: the smallest largest-stage work putting the first k blocks on stages 0..s.
    let inf = f64::INFINITY;
    let mut best = vec![vec![inf; b + 1]; n + 1];
    let mut from = vec![vec![0usize; b + 1]; n + 1];
    best[0][0] = 0.0;
    for s in 0..n {
        let least = if s > 0 && s + 1 < n { min_middle } else { 0 };
        for k in 0..=b {
            if best[s][k] == inf {
                continue;
            }
            for to in k + least..=b {
                if s + 1 == n && to != b {
                    continue;
                }
                let v = best[s][k].max(stage(s, k, to));
                if v < best[s + 1][to] {
                    best[s + 1][to] = v;
                    from[s + 1][to] = k;
                }
            }
        }
    }
    if best[n][b] == inf {
        return Err(Error::Input(format!(
            "{b} blocks cannot fill {n} stages with at least {min_middle} on each middle stage"
        )));
    }
    let mut counts = vec![0; n];
    let mut k = b;
    for s in (0..n).rev() {
        let f = from[s + 1][k];
        counts[s] = k - f;
        k = f;
    }
    Ok(counts)
}

/// Plans `req` on the best split of `layers` we find. `req.kind`'s placement decides the
/// stage count (`zb-auto` without `--placement` tries the linear and the V one). Every
/// middle stage keeps at least one block (the runtime's rule). The memory is held fixed: a
/// budget in memory (`MemLimit::Bytes`, `MemLimit::PerRank`) as given, a multiple of M_B (the kind's limit) as the bytes it
/// means under the even split, which every other split must fit too. Plans on the costs as
/// given: [`crate::planner::plan`] brings them into units near 1 first ([`crate::scale`]).
pub fn plan_split(req: &Request, layers: &LayerCosts) -> Result<Split, Error> {
    let blocks = layers.blocks()?.len();
    for (setting, n) in [
        ("stages", req.ranks),
        ("microbatches", req.microbatches),
        ("chunks", req.chunks),
    ] {
        if n == 0 {
            return Err(Error::setting(setting, "must be at least 1"));
        }
    }
    let mut search = SplitSearch {
        req,
        layers,
        errors: Vec::new(),
        even_best: None,
    };
    let mut best: Option<Candidate> = None;
    for (placement, n) in split_placements(req) {
        if let Some(h) = search.on_placement(placement, n, blocks)? {
            if best.as_ref().is_none_or(|b| better(h.score, b.score)) {
                best = Some(h);
            }
        }
    }
    let best = best.ok_or_else(|| {
        Error::Input(format!(
            "no layer split could be planned: {}",
            search.errors.join("; ")
        ))
    })?;
    Ok(Split {
        counts: best.counts,
        schedule: best.schedule,
        spec: best.spec,
        even: search.even_best.map(|e| e.0),
        budget: best.budget,
    })
}

/// The placements a split is planned on, each with its stage count.
fn split_placements(req: &Request) -> Vec<(Option<Placement>, usize)> {
    let (p, m) = (req.ranks, req.microbatches);
    match req.kind {
        ScheduleKind::ZbAuto => match req.placement {
            Some(Placement::V) => vec![(Some(Placement::V), 2 * p)],
            Some(Placement::Linear) => vec![(Some(Placement::Linear), p)],
            None if 6 * p * m <= V_CHOICE_MAX_ACTIONS => {
                vec![(Some(Placement::Linear), p), (Some(Placement::V), 2 * p)]
            }
            None => vec![(Some(Placement::Linear), p)],
        },
        kind => match kind.own_layout() {
            OwnLayout::V => vec![(None, 2 * p)],
            OwnLayout::Looped => vec![(None, p * req.chunks)],
            _ => vec![(None, p)],
        },
    }
}

/// The split search over one request: what it found wrong (for the error if nothing
/// plans) and the even split's best schedule (for comparison).
struct SplitSearch<'a> {
    req: &'a Request,
    layers: &'a LayerCosts,
    errors: Vec<String>,
    even_best: Option<(Schedule, (f64, f64))>,
}

/// The splits tried on one placement, the request they are planned under, its bytes per
/// rank (empty: none), and the best so far.
struct PlacementSearch {
    sub: Request,
    bytes: Vec<f64>,
    tried: Vec<Vec<usize>>,
    here: Option<Candidate>,
}

impl SplitSearch<'_> {
    /// `counts` planned under `r`, checked against the byte budget `check` (empty: none).
    fn plan(&self, counts: &[usize], r: &Request, check: &[f64]) -> Result<Candidate, Error> {
        let spec = self.layers.spec(counts)?;
        // The planner scaled the layers once ([`crate::scale`]): no rescaling per candidate,
        // nor a second run of each candidate that fails.
        let s = generate_as_given(r, &spec)?;
        let c = CostModel::for_schedule(&spec, &s)?.with_objective(self.req.objective);
        if !check.is_empty() {
            crate::validate::check_memory_budget(&s, &c, check)?;
        }
        let score = crate::generate::search::score(&s, &c)?;
        Ok(Candidate {
            counts: counts.to_vec(),
            schedule: s,
            spec,
            score,
            budget: check.to_vec(),
        })
    }

    /// The best split on `placement` with `n` stages: the even one, the balanced one, then
    /// single-block moves. `None` if none plans (the reasons go to `errors`).
    fn on_placement(
        &mut self,
        placement: Option<Placement>,
        n: usize,
        blocks: usize,
    ) -> Result<Option<Candidate>, Error> {
        let least = usize::from(n > 2);
        if blocks < n.saturating_sub(2) * least {
            self.errors.push(format!(
                "{blocks} blocks cannot give each of {n} stages' middle ones a block"
            ));
            return Ok(None);
        }
        let plain = Request {
            placement,
            ..self.req.clone()
        };
        // The even split under the request as given; its bytes per rank are then the
        // budget for every other split.
        let even = even_counts(blocks, n);
        let given = self.req.mem_limit.budgets();
        let first = match self.plan(&even, &plain, &given) {
            Ok(c) => Some(c),
            Err(e) => {
                self.errors.push(format!("even split on {n} stages: {e}"));
                None
            }
        };
        let bytes = self.budget_bytes(&given, first.as_ref())?;
        let budgeted = matches!(
            self.req.kind,
            ScheduleKind::ZbAuto | ScheduleKind::ZbPaper | ScheduleKind::VAuto
        );
        let sub = if budgeted && !bytes.is_empty() {
            Request {
                mem_limit: MemLimit::PerRank(bytes.clone()),
                ..plain
            }
        } else {
            plain
        };
        if let Some(f) = &first {
            if self.even_best.as_ref().is_none_or(|e| better(f.score, e.1)) {
                self.even_best = Some((f.schedule.clone(), f.score));
            }
        }
        let mut ps = PlacementSearch {
            sub,
            bytes,
            tried: vec![even],
            here: first,
        };
        if let Ok(c) = balanced_counts(self.layers, n, least) {
            self.consider(&mut ps, c);
        }
        self.single_block_moves(&mut ps, n, least);
        Ok(ps.here)
    }

    /// Each rank's bytes the other splits must fit in: the budget given, or the even
    /// split's bytes at the kind's multiple of M_B (empty if neither).
    fn budget_bytes(&self, given: &[f64], even: Option<&Candidate>) -> Result<Vec<f64>, Error> {
        if !given.is_empty() {
            return Ok(given.to_vec());
        }
        let user = self.req.mem_limit.as_multiple();
        let x = self.req.kind.planning_limit(self.req.ranks, user).or(user);
        Ok(match (even, x) {
            (Some(f), Some(x)) => {
                let c = CostModel::for_schedule(&f.spec, &f.schedule)?;
                (0..self.req.ranks)
                    .map(|r| x * c.rank_mem_b(&f.schedule, r))
                    .collect()
            }
            _ => Vec::new(),
        })
    }

    /// Plans `counts` unless tried before; true if it beats the best so far.
    fn consider(&mut self, ps: &mut PlacementSearch, counts: Vec<usize>) -> bool {
        if ps.tried.contains(&counts) {
            return false;
        }
        ps.tried.push(counts.clone());
        match self.plan(&counts, &ps.sub, &ps.bytes) {
            Ok(c) if ps.here.as_ref().is_none_or(|h| better(c.score, h.score)) => {
                ps.here = Some(c);
                true
            }
            Ok(_) => false,
            Err(e) => {
                if self.errors.len() < 8 {
                    self.errors.push(format!("split {counts:?}: {e}"));
                }
                false
            }
        }
    }

    /// Single-block moves across each boundary, from the best so far, while they help (a
    /// bounded number of plans: each is a full search).
    fn single_block_moves(&mut self, ps: &mut PlacementSearch, n: usize, least: usize) {
        let keep = |s: usize| if s > 0 && s + 1 < n { least } else { 0 };
        let mut budget = 4 * n + 8;
        while let Some(start) = ps.here.as_ref().map(|h| h.counts.clone()) {
            let mut moved = false;
            for k in 0..n - 1 {
                for (from, to) in [(k, k + 1), (k + 1, k)] {
                    let mut c = start.clone();
                    if c[from] <= keep(from) || budget == 0 {
                        continue;
                    }
                    c[from] -= 1;
                    c[to] += 1;
                    budget -= 1;
                    moved |= self.consider(ps, c);
                }
            }
            if !moved || budget == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(f: f64, mem: f64) -> RankCost {
        RankCost {
            f,
            i: f,
            w: f,
            mem_b: mem,
            mem_w: mem / 2.0,
            b: None,
        }
    }

    fn layers(blocks: Vec<f64>, head: f64) -> LayerCosts {
        LayerCosts {
            comm: 0.0,
            embedding: cost(0.01, 0.1),
            blocks: blocks.into_iter().map(|f| cost(f, 1.0)).collect(),
            block: None,
            count: 0,
            head: cost(head, 1.0),
        }
    }

    #[test]
    fn even_counts_give_the_extra_blocks_to_the_middle_stages_first() {
        assert_eq!(even_counts(10, 4), vec![2, 3, 3, 2]);
        assert_eq!(even_counts(5, 4), vec![1, 2, 1, 1]);
        assert_eq!(even_counts(7, 4), vec![2, 2, 2, 1]);
        assert_eq!(even_counts(8, 1), vec![8]);
    }

    #[test]
    fn stage_costs_sum_the_blocks_with_the_embedding_first_and_the_head_last() {
        let l = layers(vec![1.0, 2.0, 3.0, 4.0], 10.0);
        let spec = l.spec(&[1, 2, 1]).unwrap();
        let f: Vec<f64> = spec.stages.iter().map(|c| c.f).collect();
        assert_eq!(f, vec![1.0 + 0.01, 5.0, 4.0 + 10.0]);
        assert!(l.spec(&[1, 1, 1]).is_err(), "must cover every block");
    }

    /// The DP's split against every composition of a small model.
    #[test]
    fn the_balanced_split_is_the_best_contiguous_one() {
        let l = layers(vec![1.0, 3.0, 1.0, 2.0, 2.0, 1.0, 1.0], 4.0);
        let n = 4;
        let worst = |c: &[usize]| {
            l.spec(c)
                .unwrap()
                .stages
                .iter()
                .map(work)
                .fold(0.0, f64::max)
        };
        let mut brute = f64::INFINITY;
        for a in 0..=7usize {
            for b in 1..=7 - a {
                for c in 1..=7 - a - b {
                    brute = brute.min(worst(&[a, b, c, 7 - a - b - c]));
                }
            }
        }
        let got = balanced_counts(&l, n, 1).unwrap();
        assert_eq!(got.iter().sum::<usize>(), 7);
        assert!(got[1] >= 1 && got[2] >= 1);
        assert!(
            (worst(&got) - brute).abs() < 1e-12,
            "{got:?}: {} vs {brute}",
            worst(&got)
        );
    }

    /// A heavy head: the planned split moves blocks off the last stage and beats the even
    /// split's makespan, within the bytes the even split takes at 1F1B's memory.
    #[test]
    fn a_heavy_head_moves_blocks_off_the_last_stage() {
        let l = layers(vec![1.0; 16], 3.0);
        let mut req = Request::new(ScheduleKind::ZbAuto, 4, 8);
        req.objective = crate::Objective::Makespan;
        req.placement = Some(Placement::Linear);
        req.mem_limit = MemLimit::Multiple(4.0);
        let s = plan_split(&req, &l).unwrap();
        assert_eq!(s.counts.iter().sum::<usize>(), 16);
        assert!(s.counts[3] < 4, "{:?}", s.counts);
        let even_spec = l.spec(&even_counts(16, 4)).unwrap();
        let makespan = |sch: &Schedule, spec: &CostSpec| {
            let c = CostModel::for_schedule(spec, sch).unwrap();
            crate::simulate(sch, &c).unwrap().metrics.makespan
        };
        assert!(
            makespan(&s.schedule, &s.spec) < 0.95 * makespan(s.even.as_ref().unwrap(), &even_spec)
        );
    }

    #[test]
    fn both_forms_of_the_blocks_read_and_bad_ones_are_refused() {
        let text = r#"{"embedding": {"f": 0.1, "i": 0.1, "w": 0.1}, "block": {"f": 1, "i": 1, "w": 1},
                      "count": 6, "head": {"f": 2, "i": 2, "w": 2}}"#;
        let l = LayerCosts::from_json(text).unwrap();
        assert_eq!(l.blocks().unwrap().len(), 6);
        let both = r#"{"embedding": {"f": 1, "i": 1, "w": 1}, "block": {"f": 1, "i": 1, "w": 1},
                       "blocks": [{"f": 1, "i": 1, "w": 1}], "count": 2, "head": {"f": 1, "i": 1, "w": 1}}"#;
        let e = LayerCosts::from_json(both).unwrap_err().to_string();
        assert!(e.contains("either `blocks`"), "{e}");
        let e = LayerCosts::from_json(r#"{"embedding": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer costs"), "{e}");
    }
}
