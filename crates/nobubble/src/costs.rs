//! The cost flags every command shares, turned into a [`CostSpec`].

use clap::Args;
use nobubble_schedule::{
    generate, simulate, CostModel, CostSpec, Objective, Placement, RankCost, Request, Schedule,
    ScheduleKind, Simulation,
};
use std::path::PathBuf;

/// Time, communication and memory of one rank's share of the model (one 1F1B stage).
#[derive(Args, Clone, Debug)]
pub struct CostArgs {
    /// Pass times F,I,W of one rank's share of the model (B = I+W); any unit (µs in the paper).
    #[arg(
        long,
        value_name = "F,I,W",
        default_value = "1,1,1",
        allow_hyphen_values = true
    )]
    pub cost: String,
    /// Per-rank (or per-stage) costs from a JSON file; overrides --cost/--comm/--mem (see README).
    #[arg(long, value_name = "FILE.json")]
    pub costs: Option<PathBuf>,
    /// Time of one transfer between stages on different ranks.
    #[arg(
        long,
        value_name = "C",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub comm: f64,
    /// Activation memory MB,MW: what a microbatch holds after F, and after I until W.
    #[arg(
        long,
        value_name = "MB,MW",
        default_value = "1,0.5",
        allow_hyphen_values = true
    )]
    pub mem: String,
    /// Activation memory limit per rank, in units of MB; schedules over it are rejected.
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub mem_limit: Option<f64>,
    /// What the automatic schedules minimize: `span`, the longest rank span (iterations
    /// tile: post-validated optimizer steps; the paper's objective), or `makespan` (a
    /// synchronous optimizer step waits for every rank).
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Span)]
    pub objective: ObjectiveArg,
    /// zb-auto's stage placement: `auto` plans linear and V (on pipelines up to 20 000
    /// passes) and keeps the better; `linear` or `v` plans only that one.
    #[arg(long, value_enum, default_value_t = PlacementArg::Auto)]
    pub placement: PlacementArg,
}

/// `--objective`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectiveArg {
    /// Longest rank span, then makespan.
    Span,
    /// Makespan, then longest rank span.
    Makespan,
}

impl From<ObjectiveArg> for Objective {
    fn from(o: ObjectiveArg) -> Objective {
        match o {
            ObjectiveArg::Span => Objective::Span,
            ObjectiveArg::Makespan => Objective::Makespan,
        }
    }
}

/// `--placement`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementArg {
    /// Plan both, keep the better.
    Auto,
    /// Stage s on rank s.
    Linear,
    /// Two chunks per rank, down and back up.
    V,
}

impl PlacementArg {
    /// The planner's choice (`None`: it decides).
    pub fn placement(self) -> Option<Placement> {
        match self {
            PlacementArg::Auto => None,
            PlacementArg::Linear => Some(Placement::Linear),
            PlacementArg::V => Some(Placement::V),
        }
    }
}

fn numbers(flag: &str, text: &str, n: usize, example: &str) -> Result<Vec<f64>, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != n {
        return Err(format!(
            "{flag} takes {n} comma-separated numbers, e.g. {flag} {example}; got `{text}`"
        ));
    }
    parts
        .iter()
        .map(|p| {
            p.parse::<f64>()
                .map_err(|_| format!("{flag}: `{p}` is not a number (e.g. {flag} {example})"))
        })
        .collect()
}

impl CostArgs {
    /// The cost description, from the file when given, else from the flags.
    pub fn spec(&self) -> Result<CostSpec, String> {
        if let Some(l) = self.mem_limit {
            if !(l.is_finite() && l > 0.0) {
                return Err(format!("--mem-limit must be a positive number, got {l}"));
            }
        }
        if let Some(path) = &self.costs {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --costs {}: {e}", path.display()))?;
            return CostSpec::from_json(&text).map_err(|e| format!("{}: {e}", path.display()));
        }
        let t = numbers("--cost", &self.cost, 3, "1,1,1")?;
        let mem = numbers("--mem", &self.mem, 2, "1,0.5")?;
        let spec = CostSpec::uniform(
            RankCost {
                f: t[0],
                i: t[1],
                w: t[2],
                mem_b: mem[0],
                mem_w: mem[1],
            },
            self.comm,
        );
        spec.check().map_err(|e| e.to_string())?;
        Ok(spec)
    }
}

/// A generated schedule with the cost model it was resolved against and its simulation.
pub struct Planned {
    /// The schedule.
    pub schedule: Schedule,
    /// Its per-stage costs.
    pub costs: CostModel,
    /// Its simulated timeline and metrics.
    pub sim: Simulation,
}

/// Generates `kind` for the pipeline and the cost flags, and simulates it: what `plan` and
/// `compare` both start from.
pub fn plan(
    kind: ScheduleKind,
    ranks: usize,
    microbatches: usize,
    chunks: usize,
    cost_args: &CostArgs,
) -> Result<Planned, String> {
    let spec = cost_args.spec()?;
    let req = Request {
        kind,
        ranks,
        microbatches,
        chunks,
        mem_limit: cost_args.mem_limit,
        objective: cost_args.objective.into(),
        placement: cost_args.placement.placement(),
    };
    let label = format!(
        "planning {} for {ranks} ranks and {microbatches} microbatches",
        kind.name()
    );
    let schedule = crate::progress::while_working(&label, || generate(&req, &spec))
        .map_err(|e| e.to_string())?;
    let mut costs = CostModel::for_schedule(&spec, &schedule).map_err(|e| e.to_string())?;
    costs.objective = req.objective;
    let sim = simulate(&schedule, &costs).map_err(|e| e.to_string())?;
    Ok(Planned {
        schedule,
        costs,
        sim,
    })
}
