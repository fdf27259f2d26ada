//! Schedule generators, all deterministic, behind one name-based registry so the CLI,
//! `compare` and tests see the same list.

pub mod auto;
mod classic;
mod drain;
mod fuse;
pub mod greedy;
mod paper_heuristic;
mod periodic;
pub(crate) mod search;
mod v_blocks;
mod v_greedy;
pub mod v_shape;
mod zero_bubble;

pub use auto::zb_auto;
pub use classic::{gpipe, interleaved_1f1b, one_f_one_b};
pub use v_shape::{dualpipe_v, v_auto, v_placement, zb_v_pattern};
pub use zero_bubble::{interleaved_zb, zb_h1, zb_h2, zb_template};

use crate::cost::{CostModel, CostSpec, Objective};
use crate::error::Error;
use crate::limit::MemLimit;
use crate::scale::Scale;
use crate::schedule::Schedule;

/// Largest schedule (passes per iteration) the planner accepts: far beyond any real
/// pipeline, small enough that a typo cannot exhaust memory.
pub const MAX_ACTIONS: usize = 20_000_000;

/// A schedule family the planner can generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward.
    OneFOneB,
    /// 1F1B over `v` chunks per rank in loop placement.
    Interleaved1F1B,
    /// Handcrafted zero bubble at 1F1B's memory.
    ZbH1,
    /// Handcrafted zero bubble at (2p−1)·M_B.
    ZbH2,
    /// Automatic zero bubble under `--mem-limit` (default 2p).
    ZbAuto,
    /// Automatic zero bubble at 1F1B's memory, p·M_B.
    Zb1p,
    /// Automatic zero bubble at 2p·M_B.
    Zb2p,
    /// The paper's own automatic scheduler (greedy, median costs): the baseline.
    ZbPaper,
    /// Interleaved with split backward (PyTorch's ScheduleInterleavedZeroBubble shape).
    InterleavedZb,
    /// V placement at 1F1B's memory.
    ZbV,
    /// V placement at half of 1F1B's memory.
    VHalf,
    /// V placement at a third of 1F1B's memory.
    VMin,
    /// V placement under `--mem-limit` (default p).
    VAuto,
    /// DeepSeek's DualPipeV.
    DualPipeV,
}

/// The stage layout a kind plans on: what its stages are, before any request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnLayout {
    /// One stage per rank.
    Linear,
    /// Two stages per rank, down and back up.
    V,
    /// `chunks` stages per rank, stage s on rank s mod p (the interleaved kinds).
    Looped,
    /// Linear or V, as the request's placement says or the planner chooses (zb-auto).
    Either,
}

impl ScheduleKind {
    /// The layout this kind plans its stages in (the one place that says so).
    pub fn own_layout(self) -> OwnLayout {
        match self {
            ScheduleKind::ZbAuto => OwnLayout::Either,
            ScheduleKind::Interleaved1F1B | ScheduleKind::InterleavedZb => OwnLayout::Looped,
            ScheduleKind::ZbV
            | ScheduleKind::VHalf
            | ScheduleKind::VMin
            | ScheduleKind::VAuto
            | ScheduleKind::DualPipeV => OwnLayout::V,
            _ => OwnLayout::Linear,
        }
    }

    /// Every kind, in the order `compare` lists them.
    pub const ALL: [ScheduleKind; 15] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
        ScheduleKind::Zb1p,
        ScheduleKind::Zb2p,
        ScheduleKind::ZbAuto,
        ScheduleKind::ZbPaper,
        ScheduleKind::InterleavedZb,
        ScheduleKind::ZbV,
        ScheduleKind::VHalf,
        ScheduleKind::VMin,
        ScheduleKind::VAuto,
        ScheduleKind::DualPipeV,
    ];

    /// The CLI name, stable for scripts.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved1F1B => "interleaved-1f1b",
            ScheduleKind::ZbH1 => "zb-h1",
            ScheduleKind::ZbH2 => "zb-h2",
            ScheduleKind::ZbAuto => "zb-auto",
            ScheduleKind::Zb1p => "zb-1p",
            ScheduleKind::Zb2p => "zb-2p",
            ScheduleKind::ZbPaper => "zb-paper",
            ScheduleKind::InterleavedZb => "interleaved-zb",
            ScheduleKind::ZbV => "zb-v",
            ScheduleKind::VHalf => "v-half",
            ScheduleKind::VMin => "v-min",
            ScheduleKind::VAuto => "v-auto",
            ScheduleKind::DualPipeV => "dualpipe-v",
        }
    }

    /// One line for help texts and the `compare` table.
    pub fn summary(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "all forwards then all backwards; memory m·M_B",
            ScheduleKind::OneFOneB => "one forward one backward; bubble (p−1)(F+I+W), memory p·M_B",
            ScheduleKind::Interleaved1F1B => {
                "1F1B over v chunks per rank; bubble ÷ v, v× messages, m a multiple of p"
            }
            ScheduleKind::ZbH1 => "zero-bubble handcrafted; bubble (p−1)(F+I−W), memory p·M_B",
            ScheduleKind::ZbH2 => {
                "zero-bubble handcrafted; bubble (p−1)(F+I−2W), memory (2p−1)·M_B"
            }
            ScheduleKind::ZbAuto => {
                "automatic zero bubble under the memory limit (default 2p), real costs"
            }
            ScheduleKind::Zb1p => "automatic zero bubble at p·M_B (1F1B's memory)",
            ScheduleKind::Zb2p => "automatic zero bubble at 2p·M_B",
            ScheduleKind::ZbPaper => {
                "the paper's greedy scheduler (median costs, 20 knob settings) under the memory limit"
            }
            ScheduleKind::InterleavedZb => "interleaved with split backward, W delayed r on rank r",
            ScheduleKind::ZbV => "V placement, 2 chunks per rank, at p·M_B; ≈0 bubble when F≈I≈W",
            ScheduleKind::VHalf => "V placement at ≈ half of 1F1B's memory, ⌊(p+2)/2⌋·M_B",
            ScheduleKind::VMin => "V placement at ≈ a third of 1F1B's memory, ⌊(p+4)/3⌋·M_B",
            ScheduleKind::VAuto => "automatic V schedule under the memory limit (default p), real costs",
            ScheduleKind::DualPipeV => "DeepSeek's DualPipeV: V placement, F/B pairs, m ≥ 2·ranks",
        }
    }

    /// Whether the generator reads costs (and so is worth re-planning on measured costs).
    pub fn uses_costs(self) -> bool {
        matches!(
            self,
            ScheduleKind::ZbAuto
                | ScheduleKind::Zb1p
                | ScheduleKind::Zb2p
                | ScheduleKind::ZbPaper
                | ScheduleKind::ZbV
                | ScheduleKind::VHalf
                | ScheduleKind::VMin
                | ScheduleKind::VAuto
        )
    }

    /// Whether this kind plans under the user's memory limit (and so takes per-rank
    /// budgets); the others have a limit of their own or none.
    pub fn takes_limit(self) -> bool {
        matches!(
            self,
            ScheduleKind::ZbAuto | ScheduleKind::ZbPaper | ScheduleKind::VAuto
        )
    }

    /// The memory limit (× M_B per rank) this kind plans under, given the user's multiple;
    /// `None` for fixed patterns, which ignore it.
    pub fn planning_limit(self, p: usize, user: Option<f64>) -> Option<f64> {
        let p = p as f64;
        match self {
            ScheduleKind::ZbAuto | ScheduleKind::ZbPaper => Some(user.unwrap_or(2.0 * p)),
            ScheduleKind::Zb1p => Some(p),
            ScheduleKind::Zb2p => Some(2.0 * p),
            ScheduleKind::ZbV => Some(p),
            // The V-Half and V-Min building blocks' memory (Qi et al., "Pipeline
            // Parallelism with Controllable Memory"): ⌊(p+2)/2⌋ and ⌊(p+4)/3⌋ microbatches'
            // activations, about ½ and ⅓ of 1F1B's p.
            ScheduleKind::VHalf => Some(((p + 2.0) / 2.0).floor()),
            ScheduleKind::VMin => Some(((p + 4.0) / 3.0).floor()),
            ScheduleKind::VAuto => Some(user.unwrap_or(p)),
            _ => None,
        }
    }

    /// Looks a name up; the error lists every valid name.
    pub fn from_name(name: &str) -> Result<ScheduleKind, Error> {
        let key = name.trim().to_ascii_lowercase().replace('_', "-");
        // PyTorch's class names (`Schedule1F1B`), and torchtitan's spelling without the
        // prefix (`1F1B`, `ZBVZeroBubble`).
        let key = key.strip_prefix("schedule").unwrap_or(&key);
        let alias = ScheduleKind::ALIASES
            .iter()
            .find(|(a, _)| a.eq_ignore_ascii_case(key))
            .map_or(key, |(_, k)| k.name());
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == alias)
            .ok_or_else(|| {
                // A typo (one or two letters off a name) gets the name it meant.
                let near = (ScheduleKind::ALL.iter().map(|k| k.name()))
                    .map(|n| (edit_distance(key, n), n))
                    .filter(|&(d, _)| d <= 2)
                    .min();
                let hint = near.map_or(String::new(), |(_, n)| format!(" (did you mean {n}?)"));
                Error::Input(format!(
                    "unknown schedule `{name}`{hint}; valid schedules: {} (and PyTorch's class \
                     names, e.g. ScheduleZBVZeroBubble: `nobubble plan --help` and \
                     nobubble.schedule_names() list them all)",
                    ScheduleKind::ALL.map(|k| k.name()).join(", ")
                ))
            })
    }

    /// Other names accepted for a kind: PyTorch's class names (without their `Schedule`
    /// prefix, which is stripped first), the zero-bubble paper's and other spellings.
    pub const ALIASES: [(&'static str, ScheduleKind); 16] = [
        ("1f1b-interleaved", ScheduleKind::Interleaved1F1B),
        ("interleaved", ScheduleKind::Interleaved1F1B),
        ("1f1b-i", ScheduleKind::Interleaved1F1B),
        ("interleaved1f1b", ScheduleKind::Interleaved1F1B),
        ("interleavedzerobubble", ScheduleKind::InterleavedZb),
        ("zbvzerobubble", ScheduleKind::ZbV),
        ("dualpipev", ScheduleKind::DualPipeV),
        ("dualpipe", ScheduleKind::DualPipeV),
        ("zbh1", ScheduleKind::ZbH1),
        ("zbh2", ScheduleKind::ZbH2),
        ("zbv", ScheduleKind::ZbV),
        ("zb1p", ScheduleKind::Zb1p),
        ("zb2p", ScheduleKind::Zb2p),
        // Zero bubble at 1F1B's memory, as deployment guides name it.
        ("zb-1f1b", ScheduleKind::Zb1p),
        ("zb1f1b", ScheduleKind::Zb1p),
        ("1f1b-zb", ScheduleKind::Zb1p),
    ];

    /// The names users of other systems type for this kind, for help texts.
    pub fn other_names(self) -> Vec<&'static str> {
        let pytorch: &[&str] = match self {
            ScheduleKind::GPipe => &["ScheduleGPipe"],
            ScheduleKind::OneFOneB => &["Schedule1F1B"],
            ScheduleKind::Interleaved1F1B => &["ScheduleInterleaved1F1B"],
            ScheduleKind::InterleavedZb => &["ScheduleInterleavedZeroBubble"],
            ScheduleKind::ZbV => &["ScheduleZBVZeroBubble"],
            ScheduleKind::DualPipeV => &["ScheduleDualPipeV"],
            ScheduleKind::Zb1p => &["zb-1f1b"],
            _ => &[],
        };
        pytorch.to_vec()
    }
}

/// What to generate: a schedule family for a pipeline shape under a memory limit. (Most
/// callers want [`crate::planner::plan`], which also resolves the costs, chooses a layer
/// split and simulates.)
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Schedule family.
    pub kind: ScheduleKind,
    /// Pipeline ranks (devices).
    pub ranks: usize,
    /// Microbatches per iteration.
    pub microbatches: usize,
    /// Chunks per rank for interleaved schedules (ignored by the others).
    pub chunks: usize,
    /// The memory limit the automatic schedules plan under. Amounts of memory (one for
    /// every rank or one per rank, in the costs' memory unit) are planned rank by rank by the
    /// kinds that take a limit (`zb-auto`, `zb-paper`, `v-auto`): each rank within its own
    /// budget, not within the tightest rank's multiple of M_B. Fixed patterns ignore it.
    pub mem_limit: MemLimit,
    /// What the automatic schedules minimize.
    pub objective: Objective,
    /// `zb-auto`'s placement; `None`: it plans both and keeps the better.
    pub placement: Option<Placement>,
}

/// What an automatic search plans for: the pipeline, its costs, and the memory it may use.
/// One value instead of the same seven arguments through every search.
#[derive(Clone, Copy, Debug)]
pub struct Goal<'a> {
    /// Pipeline ranks.
    pub ranks: usize,
    /// Microbatches per iteration.
    pub microbatches: usize,
    /// The costs as given (resolved per layout by each search).
    pub costs: &'a CostSpec,
    /// The limit in multiples of each rank's M_B (the top of the memory ladder).
    pub limit: f64,
    /// Amounts of memory per rank (one entry: every rank), or empty: planned rank by rank.
    pub budget: &'a [f64],
    /// What to minimize.
    pub objective: Objective,
    /// The schedule's name.
    pub name: &'a str,
}

impl Goal<'_> {
    /// The same goal under `limit` × M_B for every rank, without budgets.
    pub fn at(&self, limit: f64) -> Self {
        Goal {
            limit,
            budget: &[],
            ..*self
        }
    }

    /// The costs resolved for `stages` stages, with the objective.
    pub(crate) fn resolve(&self, stages: usize) -> Result<CostModel, Error> {
        Ok(CostModel::for_layout(self.costs, stages, self.ranks)?.with_objective(self.objective))
    }
}

/// Where `zb-auto` puts the stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One stage per rank, in order.
    Linear,
    /// Two chunks per rank, down the ranks and back up ([`v_placement`]).
    V,
}

impl Placement {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Linear => "linear",
            Placement::V => "v",
        }
    }

    /// The placement a schedule uses, if it is one of these.
    pub fn of(schedule: &Schedule) -> Option<Placement> {
        if schedule.placement == v_placement(schedule.ranks) {
            Some(Placement::V)
        } else if schedule.placement == classic::linear_placement(schedule.ranks) {
            Some(Placement::Linear)
        } else {
            None
        }
    }
}

/// Levenshtein distance between two short names (in characters).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Largest pipeline (passes per iteration) on which `zb-auto` also plans the V placement
/// unasked: the V search costs about as much again, and planning should stay well under a
/// second; `--placement v` asks for it at any size.
pub const V_CHOICE_MAX_ACTIONS: usize = 20_000;

impl Request {
    /// A request with the defaults the CLI uses (2 chunks, no memory limit).
    pub fn new(kind: ScheduleKind, ranks: usize, microbatches: usize) -> Request {
        Request {
            kind,
            ranks,
            microbatches,
            chunks: 2,
            mem_limit: MemLimit::None,
            objective: Objective::Span,
            placement: None,
        }
    }
}

/// Generates the schedule described by `req`, or says why it cannot exist. Only the
/// automatic kinds read `costs`; the fixed patterns are the same for every cost model.
/// The automatic kinds plan in units near 1 ([`crate::scale`]), so the unit of time or
/// memory changes no plan's quality.
pub fn generate(req: &Request, costs: &CostSpec) -> Result<Schedule, Error> {
    let scale = Scale::of(&costs.stages, costs.comm);
    let scaled = Request {
        mem_limit: scale.limit(&req.mem_limit),
        ..req.clone()
    };
    match generate_as_given(&scaled, &scale.spec(costs)) {
        // An error may quote times or amounts of memory: found again in the user's units.
        Err(_) if !scale.is_identity() => generate_as_given(req, costs),
        planned => planned,
    }
}

/// [`generate`] on costs already in units near 1 (no rescaling, no second run on an error):
/// for searches that call it many times on inputs they scaled once (the layer split).
pub(crate) fn generate_as_given(req: &Request, costs: &CostSpec) -> Result<Schedule, Error> {
    let (p, m) = (req.ranks, req.microbatches);
    check_request(req)?;
    let mem_budget = req.mem_limit.budgets();
    let budgeted = !mem_budget.is_empty() && req.kind.takes_limit();
    let limit = request_limit(req, budgeted, &mem_budget)?;
    let name = req.kind.name();
    let budget: &[f64] = if budgeted { &mem_budget } else { &[] };
    // The automatic kinds' goal; each sets its limit.
    let base = Goal {
        ranks: p,
        microbatches: m,
        costs,
        limit: f64::NAN,
        budget,
        objective: req.objective,
        name,
    };
    let goal = |limit: f64| Goal { limit, ..base };
    let mut schedule = match req.kind {
        ScheduleKind::GPipe => gpipe(p, m),
        ScheduleKind::OneFOneB => one_f_one_b(p, m),
        ScheduleKind::Interleaved1F1B => interleaved_1f1b(p, m, req.chunks),
        ScheduleKind::ZbH1 => zb_h1(p, m),
        ScheduleKind::ZbH2 => zb_h2(p, m),
        ScheduleKind::ZbAuto => {
            zb_auto_either_placement(req, &goal(limit.expect("auto kinds plan under a limit")))
        }
        ScheduleKind::Zb1p | ScheduleKind::Zb2p => {
            zb_auto(&base.at(limit.expect("auto kinds plan under a limit")))
        }
        ScheduleKind::ZbPaper => {
            let goal = goal(limit.expect("auto kinds plan under a limit"));
            goal.resolve(p).and_then(|mut c| {
                let placement = classic::linear_placement(p);
                let x = search::apply_budget(&mut c, &placement, m, goal.budget, goal.limit)?;
                paper_heuristic::zb_paper(p, m, &c, x, name).map(|(s, _)| s)
            })
        }
        ScheduleKind::InterleavedZb => interleaved_zb(p, m, req.chunks),
        ScheduleKind::ZbV | ScheduleKind::VHalf | ScheduleKind::VMin | ScheduleKind::VAuto => {
            v_auto(&goal(limit.expect("V kinds plan under a limit")))
        }
        ScheduleKind::DualPipeV => dualpipe_v(p, m),
    }?;
    crate::validate::normalize_weight_order(&mut schedule);
    Ok(schedule)
}

/// A placement given to a schedule that is not zb-auto must be the schedule's own layout
/// (a caller that builds its stages first, as `nobubble.torch` does, passes it along);
/// another one is refused, naming the layout the schedule has.
fn check_own_placement(
    kind: ScheduleKind,
    asked: Placement,
    p: usize,
    chunks: usize,
) -> Result<(), Error> {
    let has = match (kind.own_layout(), asked) {
        (OwnLayout::Either, _) | (OwnLayout::Linear, Placement::Linear) => return Ok(()),
        (OwnLayout::V, Placement::V) => return Ok(()),
        // One rank's two looped chunks are a V too.
        (OwnLayout::Looped, Placement::V) if p == 1 && chunks == 2 => return Ok(()),
        (OwnLayout::Linear, _) => "one stage per rank (linear)",
        (OwnLayout::V, _) => "two stages per rank, down and back up (a V)",
        (OwnLayout::Looped, _) => "its chunks looped over the ranks (stage s on rank s mod p)",
    };
    let wants = match asked {
        Placement::Linear => "one stage per rank",
        Placement::V => "a V (two stages per rank)",
    };
    Err(Error::setting(
        "placement",
        format!(
            "{} places {has}, not {wants}: leave the placement to it, \
             or plan zb-auto, which plans either",
            kind.name()
        ),
    ))
}

/// Refuses a request no schedule can meet: no ranks or microbatches, a placement for a kind
/// other than its own, more ranks, stages or passes than the planner handles.
fn check_request(req: &Request) -> Result<(), Error> {
    let (p, m) = (req.ranks, req.microbatches);
    if p == 0 {
        return Err(Error::setting(
            "stages",
            "must be at least 1 (the number of pipeline ranks)",
        ));
    }
    if m == 0 {
        return Err(Error::setting(
            "microbatches",
            "must be at least 1; pipelines want m ≥ stages to keep every rank busy",
        ));
    }
    let stages = match req.kind.own_layout() {
        OwnLayout::Looped => p.saturating_mul(req.chunks),
        OwnLayout::V => p.saturating_mul(2),
        OwnLayout::Either if req.placement == Some(Placement::V) => p.saturating_mul(2),
        _ => p,
    };
    if let Some(asked) = req.placement {
        check_own_placement(req.kind, asked, p, req.chunks)?;
    }
    crate::schedule::check_size(p, stages)?;
    let actions = stages.saturating_mul(m).saturating_mul(3);
    if actions > MAX_ACTIONS {
        return Err(Error::Input(format!(
            "{stages} stages × {m} microbatches is {actions} passes per iteration, more than the \
             planner handles ({MAX_ACTIONS}); use fewer stages, chunks or microbatches"
        )));
    }
    Ok(())
}

/// The limit in multiples of M_B the kind plans under (`None`: a fixed pattern), capped at
/// `m` (no rank ever holds more); with byte budgets, `m`, the multiple then being derived per
/// layout. Refuses a budget that is not a size and a limit below one microbatch.
fn request_limit(req: &Request, budgeted: bool, budgets: &[f64]) -> Result<Option<f64>, Error> {
    let (p, m) = (req.ranks, req.microbatches);
    if let Some(b) = budgets.iter().find(|b| !(b.is_finite() && **b > 0.0)) {
        return Err(Error::setting(
            "mem_limit",
            format!("budget {b} is not a positive size; give an amount such as 20MiB"),
        ));
    }
    let limit = if budgeted {
        Some(m as f64)
    } else {
        req.kind.planning_limit(p, req.mem_limit.as_multiple())
    };
    if let Some(x) = limit {
        if !(x.is_finite() && x >= 1.0 - 1e-9) {
            return Err(Error::setting(
                "mem_limit",
                format!(
                    "{x} × M_B is below the minimum feasible 1 × M_B: every rank must hold at \
                     least one microbatch's activations; use a limit of 1 or more"
                ),
            ));
        }
    }
    Ok(limit.map(|x| x.min(m as f64)))
}

/// zb-auto on the placement asked for, or on both (where the V search is affordable) keeping
/// the better under the objective.
fn zb_auto_either_placement(req: &Request, goal: &Goal) -> Result<Schedule, Error> {
    let (p, m) = (req.ranks, req.microbatches);
    let try_v = match req.placement {
        Some(p) => p == Placement::V,
        None => 6 * p * m <= V_CHOICE_MAX_ACTIONS,
    };
    // Compared at the same bytes per rank: without budgets, the V plan gets `x` × the linear
    // layout's M_B (the V layout's M_B per rank differs when the model's segments do).
    let at_linear_bytes = goal.budget.is_empty() && req.placement.is_none();
    let v_climb = |g: &Goal, record: bool| v_shape::v_auto_climbed(g, at_linear_bytes, record);
    // A fused backward cheaper than I + W: each placement's plan may fuse (see `fuse`); on
    // small pipelines from every level of its climb.
    let cheaper = fuse::cheaper_somewhere(goal.costs);
    let ladder = cheaper && 6 * p * m <= fuse::LADDER_MAX_ACTIONS;
    let linear = (req.placement != Some(Placement::V)).then(|| auto::zb_auto_climbed(goal, ladder));
    let v = try_v.then(|| v_climb(goal, ladder));
    // Either placement may fail where the other plans (a budget one cannot meet, a costs
    // file listing one of the layouts' stages): an error only if both do.
    let (l, v) = match (linear, v) {
        (Some(Err(e)), None | Some(Err(_))) | (None, Some(Err(e))) => return Err(e),
        (l, v) => (l.and_then(Result::ok), v.and_then(Result::ok)),
    };
    let (l, v) = if cheaper {
        (
            l.map(|c| fuse::fused_plan(goal, c, ladder, auto::zb_auto_climbed))
                .transpose()?,
            v.map(|c| fuse::fused_plan(goal, c, ladder, v_climb))
                .transpose()?,
        )
    } else {
        (l.map(|c| c.plan), v.map(|c| c.plan))
    };
    pick_placement(l, v, goal.costs, req.objective)
}

/// The zero-bubble authors' own V constructions, reimplemented (as `zb-paper` is their
/// linear greedy): for `zb-v` their cost-aware ZB-V greedy at p·M_B (the best of its runs by
/// the longest rank span, their measure), for `v-half` and `v-min` the building blocks
/// squeezed to their own memory. `v-auto` holds them among its candidates; `bench` compares
/// against them.
pub fn official_v(
    kind: ScheduleKind,
    p: usize,
    m: usize,
    spec: &CostSpec,
) -> Result<Schedule, Error> {
    let name = kind.name();
    let found = match kind {
        ScheduleKind::ZbV => {
            let costs = CostModel::for_layout(spec, 2 * p, p)?;
            v_greedy::candidates(p, m, &costs, p as f64)
                .0
                .into_iter()
                .filter_map(|s| search::score(&s, &costs).ok().map(|sc| (s, sc)))
                .reduce(|a, b| if search::better(b.1, a.1) { b } else { a })
                .map(|(mut s, _)| {
                    s.name = name.to_string();
                    s
                })
        }
        ScheduleKind::VHalf => {
            let block = (v_blocks::Block::Half, v_blocks::Drain::AfterSteady);
            v_blocks::squeezed(p, m, block, None, name).map(|s| s.schedule)
        }
        ScheduleKind::VMin => {
            let block = (v_blocks::Block::Min, v_blocks::Drain::AfterSteady);
            v_blocks::squeezed(p, m, block, None, name).map(|s| s.schedule)
        }
        _ => {
            return Err(Error::Input(format!(
                "no official V construction for {name}; use zb-v, v-half or v-min"
            )))
        }
    };
    found.ok_or_else(|| {
        Error::Input(format!(
            "the authors' {name} construction does not exist for p = {p}, m = {m} (its slot \
             offsets collide); plan `{name}` itself, which falls back on its other candidates"
        ))
    })
}

/// The better of `zb-auto`'s linear and V schedules under `objective` (the linear one on a
/// tie: one message per hop instead of two).
fn pick_placement(
    linear: Option<Schedule>,
    v: Option<Schedule>,
    spec: &CostSpec,
    objective: Objective,
) -> Result<Schedule, Error> {
    match (linear, v) {
        (Some(l), Some(v)) => search::better_of(l, v, spec, objective),
        (Some(s), None) | (None, Some(s)) => Ok(s),
        (None, None) => Err(Error::Input("zb-auto: no placement to plan".into())),
    }
}

#[cfg(test)]
mod name_tests {
    use super::ScheduleKind;

    #[test]
    fn pytorch_class_names_and_guide_names_resolve() {
        for (name, kind) in [
            ("Schedule1F1B", ScheduleKind::OneFOneB),
            ("ScheduleGPipe", ScheduleKind::GPipe),
            ("ScheduleInterleaved1F1B", ScheduleKind::Interleaved1F1B),
            ("Interleaved1F1B", ScheduleKind::Interleaved1F1B),
            ("ScheduleInterleavedZeroBubble", ScheduleKind::InterleavedZb),
            ("ScheduleZBVZeroBubble", ScheduleKind::ZbV),
            ("ZBVZeroBubble", ScheduleKind::ZbV),
            ("ScheduleDualPipeV", ScheduleKind::DualPipeV),
            ("zb-1f1b", ScheduleKind::Zb1p),
            ("ZB_2P", ScheduleKind::Zb2p),
            (" zb-h1 ", ScheduleKind::ZbH1),
        ] {
            assert_eq!(ScheduleKind::from_name(name).unwrap(), kind, "{name}");
        }
        for kind in ScheduleKind::ALL {
            assert_eq!(ScheduleKind::from_name(kind.name()).unwrap(), kind);
            for other in kind.other_names() {
                assert_eq!(ScheduleKind::from_name(other).unwrap(), kind, "{other}");
            }
        }
        let e = ScheduleKind::from_name("ScheduleLoopedBFS")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown schedule `ScheduleLoopedBFS`") && e.contains("zb-v"),
            "{e}"
        );
        assert!(!e.contains("did you mean"), "{e}");
        for (typo, meant) in [("gpip", "gpipe"), ("zb-h3", "zb-h1"), ("vmin", "v-min")] {
            let e = ScheduleKind::from_name(typo).unwrap_err().to_string();
            assert!(e.contains(&format!("(did you mean {meant}?)")), "{e}");
        }
        assert_eq!(super::edit_distance("kitten", "sitting"), 3);
    }
}
