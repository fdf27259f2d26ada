//! `nobubble check`: judge a schedule written by someone else.

use crate::costs::{cli_error, CostArgs};
use crate::report::{emit, render, use_colour, Format};
use clap::Args;
use nobubble_schedule::export::csv;
use nobubble_schedule::{planner, CostSpec, Error, MemLimit, Objective, Planned};
use std::path::PathBuf;

/// Arguments of `check`.
#[derive(Args, Debug)]
// `--layer-costs` is `plan`'s alone (it chooses the layer split): refused here, so not listed.
#[command(mut_arg("layer_costs", |a| a.hide(true)))]
pub struct CheckArgs {
    /// Schedule file in PyTorch's compute-only CSV format (one row per rank); `-` reads
    /// standard input.
    pub file: PathBuf,
    #[command(flatten)]
    pub costs: CostArgs,
    /// Print the JSON report instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Width of the text timeline in columns (10 to 100000).
    #[arg(long, default_value_t = 100, value_parser = crate::output::timeline_width)]
    pub width: usize,
}

/// Runs `check`: exits non-zero with the validator's message when the file is invalid.
pub fn run(args: &CheckArgs) -> Result<(), String> {
    let text = crate::input::read_text(&args.file, "schedule", crate::input::SCHEDULE_BYTES)?;
    let stdin = args.file == std::path::Path::new("-");
    let name = (args.file.file_stem().and_then(|s| s.to_str()))
        .filter(|_| !stdin)
        .unwrap_or("custom")
        .to_string();
    let shown = if stdin {
        "standard input".to_string()
    } else {
        args.file.display().to_string()
    };
    let invalid = |e: nobubble_schedule::Error| format!("{shown}: invalid schedule: {e}");
    if text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('{')
    {
        return Err(format!(
            "{shown} is JSON (a `plan -f json` report?); check reads PyTorch's compute-only CSV: \
             write the schedule with `nobubble plan ... -f csv`"
        ));
    }
    let schedule = csv::read(&text, &name).map_err(invalid)?;
    let spec = args.costs.spec()?;
    let planned = planner::evaluate(schedule, &spec, &args.costs.limit(), Objective::default())
        .map_err(|e| match e {
            // The simulator's verdicts on the file itself.
            Error::Invalid { .. } | Error::Deadlock(_) => invalid(e),
            e => cli_error(e),
        })?;
    planned.check_limit().map_err(|e| {
        // Budgets in memory need --mem given: the default's, if it was not.
        let mem = (args.costs.mem.is_none() && args.costs.costs.is_none()).then_some("1,0.5");
        let hint = linear_layout_budgets(&planned, &spec, &args.costs.limit(), mem);
        invalid(e) + &hint.unwrap_or_default()
    })?;
    let Planned {
        schedule,
        costs,
        sim,
        limit,
        ..
    } = &planned;
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let mut out = String::new();
    if !args.json {
        out.push_str(&format!("{shown}: valid\n"));
        if let Err(e) = nobubble_schedule::check_weight_order(schedule) {
            out.push_str(&format!("note: `nobubble train` would refuse it: {e}\n"));
        }
    }
    out.push_str(&render(
        format,
        schedule,
        costs,
        sim,
        *limit,
        None,
        args.width,
        use_colour(false),
    ));
    emit(None, &out)
}

/// For a file over a multiple of M_B on a layout of several stages per rank (a V plan): the
/// per-rank budgets that multiple means on the one-stage-per-rank layout, which is how
/// `plan -s zb-auto` (placement `auto`) reads it, so that the user can re-check with those.
fn linear_layout_budgets(
    planned: &Planned,
    spec: &CostSpec,
    limit: &MemLimit,
    mem: Option<&str>,
) -> Option<String> {
    let (MemLimit::Multiple(x), s) = (limit, &planned.schedule) else {
        return None;
    };
    if s.stages == s.ranks {
        return None;
    }
    let budgets = planned.linear_layout_budgets(spec, *x).ok()?;
    Some(format!(
        "\nnote: a multiple of M_B is read on this file's own layout ({} stages on {} ranks); \
         `plan -s zb-auto` reads it on one stage per rank, where {x} × M_B is \
         --mem-limit {}{}: if zb-auto planned this file, re-check with that",
        s.stages,
        s.ranks,
        MemLimit::PerRank(budgets),
        mem.map(|m| format!(" --mem {m}")).unwrap_or_default()
    ))
}
