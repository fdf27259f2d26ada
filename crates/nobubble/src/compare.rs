//! `nobubble compare`: every applicable schedule in one table.

use crate::costs::{cli_error, plan, CostArgs, PipelineArgs};
use clap::Args;
use nobubble_schedule::error::fmt_num;
use nobubble_schedule::ScheduleKind;
use serde_json::{json, Value};

/// Arguments of `compare`.
#[derive(Args, Debug)]
// `--layer-costs` is `plan`'s alone (it chooses the layer split): refused here, so not listed.
#[command(mut_arg("layer_costs", |a| a.hide(true)))]
pub struct CompareArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    #[command(flatten)]
    pub costs: CostArgs,
    /// Print a JSON array instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One row: either figures or the reason the schedule does not apply.
struct Row {
    kind: ScheduleKind,
    outcome: Result<Figures, String>,
}

struct Figures {
    bubble_rate: f64,
    bubble_fraction: f64,
    makespan: f64,
    peak_memory: f64,
    messages: usize,
    over_limit: Option<String>,
}

fn evaluate(args: &CompareArgs, kind: ScheduleKind) -> Result<Figures, String> {
    let planned = plan(kind, &args.pipeline, &args.costs)?;
    let over_limit = planned.over_limit.map(cli_error);
    let m = planned.sim.metrics;
    Ok(Figures {
        bubble_rate: m.bubble_rate,
        bubble_fraction: m.bubble_fraction,
        makespan: m.makespan,
        peak_memory: m.peak_memory.iter().copied().fold(0.0, f64::max),
        messages: m.messages,
        over_limit,
    })
}

/// Runs `compare`.
pub fn run(args: &CompareArgs) -> Result<(), String> {
    let (stages, microbatches) = (args.pipeline.stages, args.pipeline.microbatches);
    if stages == 0 || microbatches == 0 {
        return Err("--stages and --microbatches must be at least 1".into());
    }
    args.costs.spec()?;
    let rows: Vec<Row> = ScheduleKind::ALL
        .into_iter()
        .map(|kind| Row {
            kind,
            outcome: evaluate(args, kind),
        })
        .collect();
    // One reason for every schedule (a pipeline too large, say) is the pipeline's problem:
    // said once, without a table of n/a.
    let first = rows[0].outcome.as_ref().err();
    if first.is_some() && rows.iter().all(|r| r.outcome.as_ref().err() == first) {
        return Err(first.cloned().unwrap_or_default());
    }
    let baseline = rows
        .iter()
        .find(|r| r.kind == ScheduleKind::OneFOneB)
        .and_then(|r| r.outcome.as_ref().ok())
        .map(|f| f.makespan);
    let speedup = |f: &Figures| baseline.map(|b| b / f.makespan);
    if args.json {
        print_json(&rows, &speedup);
        if rows.iter().all(|r| r.outcome.is_err()) {
            return Err(
                "no schedule applies to this pipeline (see the errors in the output)".into(),
            );
        }
        if !rows
            .iter()
            .any(|r| r.outcome.as_ref().is_ok_and(|f| f.over_limit.is_none()))
        {
            return Err("no schedule fits within --mem-limit; raise the limit".into());
        }
        return Ok(());
    }
    let best = rows
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok().map(|f| (r.kind, f)))
        .filter(|(_, f)| f.over_limit.is_none())
        .min_by(|a, b| a.1.makespan.total_cmp(&b.1.makespan))
        .map(|(k, _)| k);
    print_table(args, &rows, best, &speedup);
    if rows.iter().all(|r| r.outcome.is_err()) {
        return Err("no schedule applies to this pipeline (see the reasons above)".into());
    }
    if best.is_none() {
        return Err("no schedule fits within --mem-limit (marked !); raise the limit".into());
    }
    Ok(())
}

/// Every row as JSON, with its speed-up over 1F1B.
fn print_json(rows: &[Row], speedup: &dyn Fn(&Figures) -> Option<f64>) {
    let out: Vec<Value> = rows
        .iter()
        .map(|r| match &r.outcome {
            Ok(f) => json!({
                "schedule": r.kind.name(), "bubble_rate": f.bubble_rate,
                "bubble_fraction": f.bubble_fraction, "makespan": f.makespan,
                "peak_memory": f.peak_memory, "messages": f.messages,
                "speedup_vs_1f1b": speedup(f), "within_mem_limit": f.over_limit.is_none(),
            }),
            Err(e) => json!({"schedule": r.kind.name(), "error": e}),
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&out).expect("serializes")
    );
}

/// The table, `best` starred, then why a schedule is over the limit or does not apply.
fn print_table(
    args: &CompareArgs,
    rows: &[Row],
    best: Option<ScheduleKind>,
    speedup: &dyn Fn(&Figures) -> Option<f64>,
) {
    println!(
        "{} ranks, {} microbatches{}",
        args.pipeline.stages,
        args.pipeline.microbatches,
        args.costs
            .mem_limit
            .as_ref()
            .map(|l| format!(", memory limit {l} per rank"))
            .unwrap_or_default()
    );
    println!(
        "  {:<18} {:>11} {:>15} {:>10} {:>9} {:>9} {:>9}",
        "schedule", "bubble rate", "bubble fraction", "makespan", "peak mem", "messages", "speedup"
    );
    let mut notes = Vec::new();
    // Schedules that do not apply for one reason share one note.
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in rows {
        let mark = if Some(r.kind) == best { "*" } else { " " };
        match &r.outcome {
            Ok(f) => {
                let limit = if f.over_limit.is_some() { " !" } else { "" };
                println!(
                    "{mark} {:<18} {:>10.2}% {:>14.2}% {:>10} {:>9} {:>9} {:>8}{limit}",
                    r.kind.name(),
                    100.0 * f.bubble_rate,
                    100.0 * f.bubble_fraction,
                    fmt_num(f.makespan),
                    fmt_num(f.peak_memory),
                    f.messages,
                    speedup(f)
                        .map(|s| format!("{s:.3}x"))
                        .unwrap_or_else(|| "-".into()),
                );
                if let Some(e) = &f.over_limit {
                    notes.push(format!("  ! {}: over the memory limit: {e}", r.kind.name()));
                }
            }
            Err(e) => {
                println!("  {:<18} n/a", r.kind.name());
                match reasons.iter_mut().find(|(reason, _)| reason == e) {
                    Some((_, kinds)) => kinds.push(r.kind.name()),
                    None => reasons.push((e, vec![r.kind.name()])),
                }
            }
        }
    }
    for (e, kinds) in reasons {
        let verb = if kinds.len() == 1 { "does" } else { "do" };
        notes.push(format!("  {} {verb} not apply: {e}", kinds.join(", ")));
    }
    println!("\n* fastest within the memory limit. speedup = 1F1B makespan / makespan.");
    for n in notes {
        println!("{n}");
    }
}
