//! `nobubble check`: judge a schedule written by someone else.

use crate::costs::CostArgs;
use crate::report::{emit, render, use_colour, Format};
use clap::Args;
use nobubble_schedule::export::csv;
use nobubble_schedule::{simulate, CostModel};
use std::path::PathBuf;

/// Arguments of `check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Schedule file in PyTorch's compute-only CSV format (one row per rank).
    pub file: PathBuf,
    #[command(flatten)]
    pub costs: CostArgs,
    /// Print the JSON report instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Width of the text timeline in columns.
    #[arg(long, default_value_t = 100)]
    pub width: usize,
}

/// Runs `check`: exits non-zero with the validator's message when the file is invalid.
pub fn run(args: &CheckArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let name = args
        .file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("custom")
        .to_string();
    let invalid =
        |e: nobubble_schedule::Error| format!("{}: invalid schedule: {e}", args.file.display());
    let schedule = csv::read(&text, &name).map_err(invalid)?;
    let spec = args.costs.spec()?;
    let costs = CostModel::for_schedule(&spec, &schedule).map_err(|e| e.to_string())?;
    let sim = simulate(&schedule, &costs).map_err(invalid)?;
    args.costs.check_limit(&schedule, &costs).map_err(invalid)?;
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let mut out = String::new();
    if !args.json {
        out.push_str(&format!("{}: valid\n", args.file.display()));
        if let Err(e) = nobubble_schedule::check_weight_order(&schedule) {
            out.push_str(&format!("note: `nobubble train` would refuse it: {e}\n"));
        }
    }
    out.push_str(&render(
        format,
        &schedule,
        &costs,
        &sim,
        args.costs.mem_limit(),
        None,
        args.width,
        use_colour(false),
    ));
    emit(None, &out)
}
