//! A list scheduler that builds every rank's order at once under a memory limit, using the
//! real per-stage costs and communication time. It is the engine behind `zb-auto` and the
//! automatic V schedules: placement-agnostic, so the same code plans linear, V and
//! interleaved placements.
//!
//! Ranks are advanced in order of their clocks, so when a rank decides at time `t` every
//! pass that could be ready by `t` is already known. Priorities, per decision:
//! 1. an input gradient whose dependency has arrived (it is on the critical path);
//! 2. a forward whose input has arrived and that fits in memory (optionally only when it
//!    does not delay an input gradient known to arrive before it would end);
//! 3. a weight gradient, if memory forces it or (per policy) it fits in the wait;
//! 4. otherwise wait for the next arrival.
//!
//! Memory: a microbatch's first forward on a rank (its first chunk there) is admitted only if
//! room stays free for one microbatch's later chunks. A rank therefore never fills up with
//! first chunks and starves the later-chunk forward of the oldest microbatch it holds (which
//! would deadlock a V schedule), yet long-lived first-chunk activations can use all the rest.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;

/// The knobs the search turns. Each is a policy choice for which no single setting is best
/// on every input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// Run a ready forward even if an input gradient will arrive before it ends.
    pub forward_may_delay_backward: bool,
    /// How much a weight gradient may overshoot the wait for the next arrival, as a fraction
    /// of its own time (0 = only when it fits, ≥ 1 = whenever the rank would idle).
    pub w_overshoot: f64,
    /// Prefer the deeper stage (larger index) among ready forwards; for V placements this
    /// pushes microbatches to the turn sooner.
    pub deeper_forward_first: bool,
    /// At most this many microbatches in flight through a rank's first stage (forward run,
    /// input gradient not yet), on rank `r` less `r · cap_slope / 2` (at least 1): the
    /// warm-up depth of 1F1B, for placements where memory alone admits too many first-chunk
    /// forwards and the later chunks then wait for room. `None`: memory alone decides.
    pub in_flight_cap: Option<usize>,
    /// How much the cap falls per rank, in half microbatches (later ranks' round trips are
    /// shorter, so they need fewer in flight).
    pub cap_slope: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            forward_may_delay_backward: false,
            w_overshoot: 0.0,
            deeper_forward_first: true,
            in_flight_cap: None,
            cap_slope: 0,
        }
    }
}

struct RankState {
    clock: f64,
    mem: f64,
    /// Memory kept free for one microbatch's later-chunk forwards.
    reserve: f64,
    limit: f64,
    stages: Vec<usize>,
    first_stage: usize,
    /// Memory one microbatch needs on this rank (all its stages' M_B).
    admit: f64,
    order: Vec<Action>,
}

/// Builds a schedule for `placement` (stage → rank) with per-rank memory limit `x` (in
/// multiples of each rank's M_B) under `policy`. Each pass kind runs in microbatch order on
/// every stage, which also keeps gradient accumulation bit-identical to unpipelined training.
pub fn list_schedule(
    name: &str,
    placement: &[usize],
    ranks: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    policy: &Policy,
) -> Result<Schedule, Error> {
    list_schedule_bound(name, placement, ranks, m, costs, x, policy).map(|(s, _)| s)
}

/// As [`list_schedule`], also saying whether the memory limit ever held a forward back.
/// The limit enters the scheduler only through that test, so when it never bound, every
/// larger limit gives the very same schedule — the memory ladders use this to skip runs.
pub fn list_schedule_bound(
    name: &str,
    placement: &[usize],
    ranks: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    policy: &Policy,
) -> Result<(Schedule, bool), Error> {
    let mut ls = ListScheduler::new(placement, ranks, m, costs, x, policy)?;
    // Ranks that found nothing to do at their current clock and wait for another rank.
    let mut blocked = vec![false; ranks];
    let total = 3 * ls.n * m;
    let mut done = 0;
    while done < total {
        // The unfinished, unblocked rank with the earliest clock decides next.
        let Some(r) = (0..ranks)
            .filter(|&q| !blocked[q] && ls.unfinished(q))
            .min_by(|&a, &b| ls.rs[a].clock.total_cmp(&ls.rs[b].clock))
        else {
            return Err(Error::Input(format!(
                "the automatic scheduler found no rank able to move (memory limit {x} × M_B too tight for this placement?)"
            )));
        };
        match ls.choose(r) {
            Decision::Run(a) => {
                // Wake only the ranks this pass can unblock: the consumer of its output.
                blocked[r] = false;
                match a.kind {
                    Kind::F if a.stage + 1 < ls.n => blocked[placement[a.stage + 1]] = false,
                    Kind::I if a.stage > 0 => blocked[placement[a.stage - 1]] = false,
                    _ => {}
                }
                ls.run(r, a);
                done += 1;
            }
            Decision::SleepUntil(t) => ls.rs[r].clock = t,
            // With no arrival known, wait until another rank schedules something (which is
            // what could make an arrival known).
            Decision::Wait => blocked[r] = true,
        }
    }
    let orders = ls.rs.into_iter().map(|st| st.order).collect();
    Ok((
        Schedule::new(name, ls.n, ranks, m, placement.to_vec(), orders)?,
        ls.memory_bound,
    ))
}

/// What a rank does at its clock.
enum Decision {
    Run(Action),
    /// Nothing now; the next known arrival is at this time.
    SleepUntil(f64),
    /// Nothing now and no arrival known.
    Wait,
}

/// The ready pass of one kind a rank would pick, and the earliest later arrival of its
/// kind's inputs.
struct Ready {
    stage: Option<usize>,
    next_arrival: f64,
}

/// The list scheduler's state: every rank's clock, memory and order so far, how far each
/// stage's passes have come, and when each F and I ended.
struct ListScheduler<'a> {
    placement: &'a [usize],
    n: usize,
    m: usize,
    costs: &'a CostModel,
    policy: &'a Policy,
    rs: Vec<RankState>,
    /// Next microbatch per stage for each pass kind.
    next_f: Vec<usize>,
    next_i: Vec<usize>,
    next_w: Vec<usize>,
    /// End times of F and I per (stage, microbatch); NaN until run.
    end_f: Vec<f64>,
    end_i: Vec<f64>,
    /// Whether the memory limit ever held a forward back.
    memory_bound: bool,
}

impl<'a> ListScheduler<'a> {
    /// Every rank's state at time 0, or an error if a rank holds no stage or cannot hold
    /// one microbatch within the limit.
    fn new(
        placement: &'a [usize],
        ranks: usize,
        m: usize,
        costs: &'a CostModel,
        x: f64,
        policy: &'a Policy,
    ) -> Result<Self, Error> {
        let n = placement.len();
        let rs: Vec<RankState> = (0..ranks)
            .map(|r| {
                let stages: Vec<usize> = (0..n).filter(|&s| placement[s] == r).collect();
                let admit: f64 = stages.iter().map(|&s| costs.stages[s].mem_b).sum();
                RankState {
                    clock: 0.0,
                    mem: 0.0,
                    reserve: admit - stages.first().map_or(0.0, |&s| costs.stages[s].mem_b),
                    limit: x * admit * costs.share(r),
                    first_stage: stages.first().copied().unwrap_or(0),
                    stages,
                    admit,
                    order: Vec::with_capacity(3 * m * n / ranks.max(1)),
                }
            })
            .collect();
        for (r, st) in rs.iter().enumerate() {
            if st.stages.is_empty() {
                return Err(Error::Input(format!("rank {r} holds no stage")));
            }
            if st.admit > st.limit * (1.0 + 1e-9) {
                return Err(Error::Input(format!(
                    "memory limit {x} × M_B is below the minimum feasible 1 × M_B on rank {r}: \
                     a rank must hold at least one microbatch's activations; use --mem-limit 1 or more"
                )));
            }
        }
        Ok(ListScheduler {
            placement,
            n,
            m,
            costs,
            policy,
            rs,
            next_f: vec![0; n],
            next_i: vec![0; n],
            next_w: vec![0; n],
            end_f: vec![f64::NAN; n * m],
            end_i: vec![f64::NAN; n * m],
            memory_bound: false,
        })
    }

    fn comm(&self, from: usize, to: usize) -> f64 {
        if self.placement[from] != self.placement[to] {
            self.costs.comm
        } else {
            0.0
        }
    }

    fn unfinished(&self, r: usize) -> bool {
        let m = self.m;
        (self.rs[r].stages.iter())
            .any(|&s| self.next_w[s] < m || self.next_f[s] < m || self.next_i[s] < m)
    }

    /// Rank `r`'s input gradients at time `t`: the deepest ready stage, and the earliest
    /// known future arrival.
    fn ready_input_grad(&self, r: usize, t: f64) -> Ready {
        let (n, m) = (self.n, self.m);
        let mut ready = Ready {
            stage: None,
            next_arrival: f64::INFINITY,
        };
        for &s in &self.rs[r].stages {
            let j = self.next_i[s];
            if j >= m || j >= self.next_f[s] {
                continue;
            }
            let arrival = if s + 1 == n {
                self.end_f[s * m + j]
            } else {
                self.end_i[(s + 1) * m + j] + self.comm(s + 1, s)
            };
            if arrival.is_nan() {
                continue;
            }
            if arrival <= t {
                if ready.stage.is_none_or(|b| s > b) {
                    ready.stage = Some(s);
                }
            } else {
                ready.next_arrival = ready.next_arrival.min(arrival);
            }
        }
        ready
    }

    /// Rank `r`'s forwards at time `t` whose input has arrived and that memory (and the
    /// policy's in-flight cap) admits, the policy's preferred one first; also whether
    /// memory held one back.
    fn ready_forward(&mut self, r: usize, t: f64) -> (Ready, bool) {
        let (m, policy) = (self.m, self.policy);
        let st = &self.rs[r];
        let mut ready = Ready {
            stage: None,
            next_arrival: f64::INFINITY,
        };
        let mut memory_blocks = false;
        for &s in &st.stages {
            let j = self.next_f[s];
            if j >= m {
                continue;
            }
            let arrival = if s == 0 {
                0.0
            } else {
                self.end_f[(s - 1) * m + j] + self.comm(s - 1, s)
            };
            if arrival.is_nan() {
                continue;
            }
            if arrival > t {
                ready.next_arrival = ready.next_arrival.min(arrival);
                continue;
            }
            if s == st.first_stage && capped(policy, r, self.next_f[s] - self.next_i[s]) {
                continue;
            }
            let mem_b = self.costs.stages[s].mem_b;
            let need = mem_b + if s == st.first_stage { st.reserve } else { 0.0 };
            if st.mem + need > st.limit * (1.0 + 1e-9) {
                memory_blocks = true;
                continue;
            }
            let better = match ready.stage {
                None => true,
                Some(b) => (s > b) == policy.deeper_forward_first,
            };
            if better {
                ready.stage = Some(s);
            }
        }
        self.memory_bound |= memory_blocks;
        (ready, memory_blocks)
    }

    /// What rank `r` does at its clock, by the priorities in the module's doc.
    fn choose(&mut self, r: usize) -> Decision {
        let t = self.rs[r].clock;
        let input_grads = self.ready_input_grad(r, t);
        let (forwards, memory_blocks_f) = self.ready_forward(r, t);
        let (costs, policy) = (self.costs, self.policy);
        let (next_i, next_f, next_w) = (&self.next_i, &self.next_f, &self.next_w);
        let w_stage = pending_w(&self.rs[r], next_w, next_i);
        let next_arrival = input_grads.next_arrival.min(forwards.next_arrival);
        let w_fits = |s: usize, until: f64| {
            let w = costs.stages[s].w;
            until.is_infinite() || t + w <= until + policy.w_overshoot * w + 1e-12
        };
        let chosen: Option<Action> = if let Some(s) = input_grads.stage {
            Some(Action::new(s, Kind::I, next_i[s]))
        } else if let Some(s) = forwards.stage {
            let f_end = t + costs.stages[s].f;
            if policy.forward_may_delay_backward || f_end <= input_grads.next_arrival + 1e-12 {
                Some(Action::new(s, Kind::F, next_f[s]))
            } else {
                w_stage
                    .filter(|&ws| w_fits(ws, input_grads.next_arrival))
                    .map(|ws| Action::new(ws, Kind::W, next_w[ws]))
            }
        } else if let Some(ws) = w_stage {
            (memory_blocks_f || w_fits(ws, next_arrival))
                .then(|| Action::new(ws, Kind::W, next_w[ws]))
        } else {
            None
        };
        match chosen {
            Some(a) => Decision::Run(a),
            None if next_arrival.is_finite() && next_arrival > t => {
                Decision::SleepUntil(next_arrival)
            }
            None => Decision::Wait,
        }
    }

    /// Runs `a` on rank `r` at its clock.
    fn run(&mut self, r: usize, a: Action) {
        let (s, j, m) = (a.stage, a.microbatch, self.m);
        let st = &mut self.rs[r];
        let end = st.clock + self.costs.time(s, a.kind);
        match a.kind {
            Kind::F => {
                self.next_f[s] += 1;
                self.end_f[s * m + j] = end;
            }
            Kind::I => {
                self.next_i[s] += 1;
                self.end_i[s * m + j] = end;
            }
            Kind::W => self.next_w[s] += 1,
            Kind::B => unreachable!("the list scheduler splits every backward"),
        }
        st.mem += self.costs.mem_delta(s, a.kind);
        st.clock = end;
        st.order.push(a);
    }
}

/// Whether `policy`'s in-flight cap keeps rank `r`, holding `in_flight` microbatches in its
/// first stage, from admitting another.
fn capped(policy: &Policy, r: usize, in_flight: usize) -> bool {
    policy.in_flight_cap.is_some_and(|cap| {
        let cap = (2 * cap).saturating_sub(r * policy.cap_slope).max(2) / 2;
        in_flight >= cap
    })
}

/// The stage with the oldest pending weight gradient on this rank, if any.
fn pending_w(st: &RankState, next_w: &[usize], next_i: &[usize]) -> Option<usize> {
    st.stages
        .iter()
        .copied()
        .filter(|&s| next_w[s] < next_i[s])
        .min_by_key(|&s| (next_w[s], std::cmp::Reverse(s)))
}
