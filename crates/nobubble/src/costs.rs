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
    /// Per-layer costs (embedding, blocks, head) from a JSON file: the planner also chooses
    /// how many blocks each stage holds (see README); overrides --cost/--costs/--comm/--mem.
    #[arg(long, value_name = "FILE.json", conflicts_with = "costs")]
    pub layer_costs: Option<PathBuf>,
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
    /// Activation memory limit per rank: a number is a multiple of each rank's MB; a size
    /// (`20MiB`, `1609728B`) or a comma-separated list of sizes, one per rank, is a budget
    /// in --mem's unit that zb-auto, zb-paper and v-auto plan each rank within. Schedules
    /// over it are rejected.
    #[arg(
        long = "mem-limit",
        value_name = "X|SIZE[,SIZE…]",
        allow_hyphen_values = true
    )]
    pub mem_limit_text: Option<String>,
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

/// A size's number and, when it has a unit suffix (GiB, MiB, KiB, GB, MB, KB, B), the
/// bytes per unit; shared by every `--mem-limit`.
pub(crate) fn split_size(text: &str) -> (&str, Option<f64>) {
    let t = text.trim();
    [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1000),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim(), Some(*m as f64))))
    .unwrap_or((t, None))
}

/// `--mem-limit` read: a multiple of M_B, or absolute budgets (one for all ranks or one per
/// rank) in --mem's unit.
#[derive(Clone, Debug, PartialEq)]
pub enum MemLimit {
    /// No limit.
    None,
    /// `X` × each rank's M_B.
    Multiple(f64),
    /// Amounts of memory per rank.
    Budget(Vec<f64>),
}

impl MemLimit {
    /// Parses the flag's text (see [`CostArgs::mem_limit_text`]).
    pub fn parse(text: &str) -> Result<MemLimit, String> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if parts.len() > 1 {
            if let Some(bare) = parts.iter().find(|p| split_size(p).1.is_none()) {
                return Err(format!(
                    "--mem-limit: in a list every budget needs a unit (`{bare}` has none): \
                     write e.g. 20MiB,24MiB or 1609728B,2000000B"
                ));
            }
        }
        if parts.len() == 1 && split_size(parts[0]).1.is_none() {
            let x: f64 = parts[0].parse().map_err(|_| {
                format!("--mem-limit: `{text}` is neither a multiple of MB (e.g. 8) nor a size (e.g. 20MiB)")
            })?;
            if !(x.is_finite() && x > 0.0) {
                return Err(format!("--mem-limit must be a positive number, got {text}"));
            }
            return Ok(MemLimit::Multiple(x));
        }
        parts
            .iter()
            .map(|p| {
                let (num, unit) = split_size(p);
                let v: f64 = num.parse().map_err(|_| {
                    format!("--mem-limit: `{p}` is not a size; write e.g. 20MiB, 1609728B, or a list 20MiB,24MiB with one per rank")
                })?;
                let v = v * unit.unwrap_or(1.0);
                if !(v.is_finite() && v > 0.0) {
                    return Err(format!("--mem-limit: `{p}` must be a positive size"));
                }
                Ok(v)
            })
            .collect::<Result<Vec<f64>, String>>()
            .map(MemLimit::Budget)
    }
}

impl CostArgs {
    /// `--mem-limit`, read.
    pub fn limit(&self) -> Result<MemLimit, String> {
        self.mem_limit_text
            .as_deref()
            .map_or(Ok(MemLimit::None), MemLimit::parse)
    }

    /// `--mem-limit` as a multiple of M_B, when it is one.
    pub fn mem_limit(&self) -> Option<f64> {
        match self.limit() {
            Ok(MemLimit::Multiple(x)) => Some(x),
            _ => None,
        }
    }

    /// `--mem-limit` as budgets per rank, when it is that (else empty).
    pub fn mem_budget(&self) -> Vec<f64> {
        match self.limit() {
            Ok(MemLimit::Budget(b)) => b,
            _ => Vec::new(),
        }
    }

    /// Checks a schedule against `--mem-limit`, whichever form it has.
    pub fn check_limit(
        &self,
        schedule: &Schedule,
        costs: &CostModel,
    ) -> Result<(), nobubble_schedule::Error> {
        match self.limit() {
            Ok(MemLimit::Multiple(x)) => nobubble_schedule::check_memory(schedule, costs, x),
            Ok(MemLimit::Budget(b)) => {
                if b.len() != 1 && b.len() != schedule.ranks {
                    return Err(nobubble_schedule::Error::Input(format!(
                        "--mem-limit lists {} budgets for {} ranks: give one for all ranks or \
                         one per rank",
                        b.len(),
                        schedule.ranks
                    )));
                }
                nobubble_schedule::validate::check_memory_budget(schedule, costs, &b)
            }
            _ => Ok(()),
        }
    }

    /// The cost description, from the file when given, else from the flags.
    pub fn spec(&self) -> Result<CostSpec, String> {
        let limit = self.limit()?;
        if self.layer_costs.is_some() {
            return Err(
                "--layer-costs works with `nobubble plan`, which chooses the layer split; here \
                 give --cost or --costs"
                    .into(),
            );
        }
        // A size needs memory in bytes: with the unitless default --mem it would mean
        // millions of microbatches, that is no limit at all.
        if let MemLimit::Budget(_) = limit {
            if self.costs.is_none() && self.mem == "1,0.5" {
                return Err(
                    "--mem-limit as a size needs --mem (or --costs) in bytes, e.g. --mem \
                     201216,73728; or give a multiple of MB, e.g. --mem-limit 8"
                        .into(),
                );
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
    /// With `--mem-limit` budgets: the multiple of M_B the ranks' shares on `costs` are of.
    pub budget_multiple: Option<f64>,
    /// With `--layer-costs`: the blocks per stage chosen, and the even split with its
    /// simulation (`None` where the even split does not plan).
    pub split: Option<ChosenSplit>,
}

/// `--layer-costs`' outcome: the blocks per stage chosen, and the even split with its
/// simulation (`None` where the even split does not plan).
pub type ChosenSplit = (Vec<usize>, Option<(Vec<usize>, Simulation)>);

/// Generates `kind` for the pipeline and the cost flags, and simulates it: what `plan` and
/// `compare` both start from.
pub fn plan(
    kind: ScheduleKind,
    ranks: usize,
    microbatches: usize,
    chunks: usize,
    cost_args: &CostArgs,
) -> Result<Planned, String> {
    let spec = if cost_args.layer_costs.is_some() {
        cost_args.limit()?;
        // The stages' costs come from the split.
        CostSpec::uniform(RankCost::default(), 0.0)
    } else {
        cost_args.spec()?
    };
    let req = Request {
        kind,
        ranks,
        microbatches,
        chunks,
        mem_limit: cost_args.mem_limit(),
        mem_budget: cost_args.mem_budget(),
        objective: cost_args.objective.into(),
        placement: cost_args.placement.placement(),
    };
    let label = format!(
        "planning {} for {ranks} ranks and {microbatches} microbatches",
        kind.name()
    );
    let mut split = None;
    let (schedule, spec) = match &cost_args.layer_costs {
        None => (
            crate::progress::while_working(&label, || generate(&req, &spec))
                .map_err(|e| e.to_string())?,
            spec,
        ),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --layer-costs {}: {e}", path.display()))?;
            let layers = nobubble_schedule::split::LayerCosts::from_json(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let label = format!("{label}, choosing the layer split");
            let s = crate::progress::while_working(&label, || {
                nobubble_schedule::split::plan_split(&req, &layers)
            })
            .map_err(|e| e.to_string())?;
            let blocks = layers.blocks().map_err(|e| e.to_string())?.len();
            let even = match &s.even {
                Some(e) => {
                    let counts = nobubble_schedule::split::even_counts(blocks, e.stages);
                    let spec = layers.spec(&counts).map_err(|e| e.to_string())?;
                    let c = CostModel::for_schedule(&spec, e).map_err(|e| e.to_string())?;
                    Some((counts, simulate(e, &c).map_err(|e| e.to_string())?))
                }
                None => None,
            };
            split = Some((s.counts, even));
            (s.schedule, s.spec)
        }
    };
    let mut costs = CostModel::for_schedule(&spec, &schedule).map_err(|e| e.to_string())?;
    costs.objective = req.objective;
    // Report and bound against each rank's own budget.
    let budget_multiple = (!req.mem_budget.is_empty())
        .then(|| {
            nobubble_schedule::generate::auto::apply_budget(
                &mut costs,
                &schedule.placement,
                microbatches,
                &req.mem_budget,
                1.0,
            )
        })
        .transpose()
        .map_err(|e| e.to_string())?;
    let sim = simulate(&schedule, &costs).map_err(|e| e.to_string())?;
    Ok(Planned {
        schedule,
        costs,
        sim,
        budget_multiple,
        split,
    })
}
