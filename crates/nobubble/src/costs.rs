//! The cost flags every command shares, turned into the planner's [`PlanRequest`], and the
//! pipeline-shape flags `plan` and `compare` share. Planning itself is the library's
//! ([`nobubble_schedule::plan`]); this only reads flags and names them in errors.

use clap::Args;
use nobubble_schedule::split::LayerCosts;
use nobubble_schedule::{
    CostSpec, Error, MemLimit, Objective, Placement, PlanCosts, PlanRequest, Planned, RankCost,
    ScheduleKind,
};
use std::path::PathBuf;

/// The pipeline's shape, as `plan` and `compare` take it.
#[derive(Args, Clone, Debug)]
pub struct PipelineArgs {
    /// Pipeline stages (ranks, devices).
    #[arg(long, short = 'p')]
    pub stages: usize,
    /// Microbatches per iteration.
    #[arg(long, short = 'm')]
    pub microbatches: usize,
    /// Model chunks per rank (interleaved-1f1b, interleaved-zb) [default: 2].
    #[arg(long)]
    pub chunks: Option<usize>,
}

/// A transformer's shape, as `train` (overriding its preset) and `forecast` take it.
#[derive(Args, Clone, Debug, Default)]
pub struct ModelShapeArgs {
    /// Transformer blocks (train: overrides the preset).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Hidden size (train: overrides the preset).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Attention heads (train: overrides the preset).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Sequence length in tokens [train: the preset's; forecast: 1024].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Sequences per microbatch [train: the preset's; forecast: 1].
    #[arg(long)]
    pub microbatch_size: Option<usize>,
}

/// The flag a planner setting is given with (`mem_limit` → `--mem-limit`).
pub fn flag(setting: &str) -> String {
    let name = match setting {
        "comm_seconds" => "comm-ms",
        "peak_flops" => "peak-tflops",
        other => other,
    };
    format!("--{}", name.replace('_', "-"))
}

/// A planner error as the CLI prints it: settings named by their flags.
pub fn cli_error(e: Error) -> String {
    e.naming(flag)
}

/// `--mem-limit`'s value parser: the planner's one reading of the text (clap names the flag).
pub fn parse_mem_limit(text: &str) -> Result<MemLimit, String> {
    MemLimit::parse(text).map_err(|e| match e {
        Error::Setting { message, .. } => message,
        e => e.to_string(),
    })
}

/// Time, communication and memory of one rank's share of the model (one 1F1B stage).
#[derive(Args, Clone, Debug)]
pub struct CostArgs {
    /// Pass times F,I,W of one rank's share of the model; any unit (µs in the paper). A fourth
    /// number B is the fused backward's time where it is not I+W (PyTorch's split backward
    /// costs extra): fused (B) passes cost B, and zb-auto weighs plans that fuse them.
    #[arg(
        long,
        value_name = "F,I,W[,B]",
        default_value = "1,1,1",
        allow_hyphen_values = true
    )]
    pub cost: String,
    /// Per-stage costs from a JSON file, instead of --cost/--comm/--mem (see README).
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["cost", "comm", "mem"])]
    pub costs: Option<PathBuf>,
    /// Per-layer costs (embedding, blocks, head) from a JSON file: the planner also chooses
    /// how many blocks each stage holds (see README); instead of --cost/--costs/--comm/--mem.
    #[arg(
        long,
        value_name = "FILE.json",
        conflicts_with_all = ["costs", "cost", "comm", "mem"]
    )]
    pub layer_costs: Option<PathBuf>,
    /// Time of one transfer between stages on different ranks.
    #[arg(
        long,
        value_name = "C",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub comm: f64,
    /// Activation memory MB,MW: what a microbatch holds after F, and after I until W
    /// [default: 1,0.5].
    #[arg(long, value_name = "MB,MW", allow_hyphen_values = true)]
    pub mem: Option<String>,
    /// Activation memory limit per rank: a bare number is always a multiple of each rank's
    /// MB; a size (`20MiB`, `1609728B`) or a comma-separated list of sizes, one per rank, is
    /// a budget in --mem's unit that zb-auto, zb-paper and v-auto plan each rank within.
    /// Schedules over it are rejected.
    #[arg(
        long = "mem-limit",
        value_name = "X|SIZE[,SIZE…]",
        allow_hyphen_values = true,
        value_parser = parse_mem_limit
    )]
    pub mem_limit: Option<MemLimit>,
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

/// `text` as `n` comma-separated numbers, `n` in `lens`; the error names `flag` and shows
/// `example`.
pub(crate) fn numbers(
    flag: &str,
    text: &str,
    lens: std::ops::RangeInclusive<usize>,
    example: &str,
) -> Result<Vec<f64>, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if !lens.contains(&parts.len()) {
        let n = match (lens.start(), lens.end()) {
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a} or {b}"),
        };
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
    /// `--mem-limit`, or no limit.
    pub fn limit(&self) -> MemLimit {
        self.mem_limit.clone().unwrap_or_default()
    }

    /// The cost description, from the file when given, else from the flags.
    pub fn spec(&self) -> Result<CostSpec, String> {
        if self.layer_costs.is_some() {
            return Err(
                "--layer-costs works with `nobubble plan`, which chooses the layer split; here \
                 give --cost or --costs"
                    .into(),
            );
        }
        self.stage_spec()
    }

    fn stage_spec(&self) -> Result<CostSpec, String> {
        // A size needs memory in bytes: with the unitless default --mem it would mean
        // millions of microbatches, that is no limit at all.
        if !self.limit().budgets().is_empty() && self.costs.is_none() && self.mem.is_none() {
            return Err(
                "--mem-limit as a size needs --mem (or --costs) in bytes, e.g. --mem \
                 201216,73728; or give a multiple of MB, e.g. --mem-limit 8"
                    .into(),
            );
        }
        if let Some(path) = &self.costs {
            let text = crate::input::read_text(path, "--costs", crate::input::COSTS_BYTES)?;
            return CostSpec::from_json(&text).map_err(|e| format!("{}: {e}", path.display()));
        }
        let t = numbers("--cost", &self.cost, 3..=4, "1,1,1")?;
        let mem = numbers(
            "--mem",
            self.mem.as_deref().unwrap_or("1,0.5"),
            2..=2,
            "1,0.5",
        )?;
        let spec = CostSpec::uniform(
            RankCost {
                f: t[0],
                i: t[1],
                w: t[2],
                mem_b: mem[0],
                mem_w: mem[1],
                b: t.get(3).copied(),
            },
            self.comm,
        );
        spec.check().map_err(|e| e.to_string())?;
        Ok(spec)
    }

    /// What the costs are: the stages' (`--cost`, `--costs`) or the layers'
    /// (`--layer-costs`, read from its file).
    fn plan_costs(&self) -> Result<PlanCosts, String> {
        match &self.layer_costs {
            None => self.stage_spec().map(PlanCosts::Stages),
            Some(path) => {
                let text =
                    crate::input::read_text(path, "--layer-costs", crate::input::COSTS_BYTES)?;
                LayerCosts::from_json(&text)
                    .map(PlanCosts::Layers)
                    .map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// The planner's request for `kind` on this pipeline under these flags.
    pub fn request(&self, kind: ScheduleKind, pipe: &PipelineArgs) -> Result<PlanRequest, String> {
        Ok(PlanRequest {
            schedule: kind,
            ranks: pipe.stages,
            microbatches: pipe.microbatches,
            chunks: pipe.chunks.unwrap_or(2),
            costs: self.plan_costs()?,
            mem_limit: self.limit(),
            placement: self.placement.placement(),
            objective: self.objective.into(),
        })
    }
}

/// Plans `kind` for the pipeline and the cost flags (the library's planner, with a spinner
/// on long work): what `plan` and `compare` both start from.
pub fn plan(
    kind: ScheduleKind,
    pipe: &PipelineArgs,
    cost_args: &CostArgs,
) -> Result<Planned, String> {
    let req = cost_args.request(kind, pipe)?;
    let mut label = format!(
        "planning {} for {} ranks and {} microbatches",
        kind.name(),
        pipe.stages,
        pipe.microbatches
    );
    if cost_args.layer_costs.is_some() {
        label.push_str(", choosing the layer split");
    }
    crate::progress::while_working(&label, || nobubble_schedule::plan(&req)).map_err(cli_error)
}
