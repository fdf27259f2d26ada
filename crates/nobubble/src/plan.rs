//! `nobubble plan`: generate, simulate, export.

use crate::costs::{cli_error, plan, CostArgs, PipelineArgs};
use crate::report::{emit, json_report, json_text, render, use_colour, Format};
use clap::Args;
use nobubble_schedule::error::fmt_num;
use nobubble_schedule::planner::LayerSplit;
use nobubble_schedule::{Planned, ScheduleKind};
use std::path::PathBuf;

/// Arguments of `plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-1p, zb-2p, zb-auto, zb-paper,
    /// interleaved-zb, zb-v, v-half, v-min, v-auto, dualpipe-v, or another name listed below.
    #[arg(
        long,
        short = 's',
        visible_alias = "pipeline-schedule",
        default_value = "zb-h2"
    )]
    pub schedule: String,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    #[command(flatten)]
    pub costs: CostArgs,
    /// Output format [default: from -o's extension (.csv, .svg, .json), else text].
    #[arg(long, short = 'f', value_enum, ignore_case = true)]
    pub format: Option<Format>,
    /// Write to this file instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Width of the text timeline in columns (10 to 100000).
    #[arg(long, default_value_t = 100, value_parser = crate::output::timeline_width)]
    pub width: usize,
}

/// The schedule list of `plan --help`: every name, what it is, and the names users of
/// PyTorch and deployment guides type for it.
pub fn schedules_help() -> String {
    let mut out = String::from("Schedules (names are case-insensitive):\n");
    for k in ScheduleKind::ALL {
        let others = k.other_names();
        let aka = if others.is_empty() {
            String::new()
        } else {
            format!(" [also: {}]", others.join(", "))
        };
        out.push_str(&format!("  {:<17} {}{aka}\n", k.name(), k.summary()));
    }
    out.push_str(
        "\nPyTorch's class names work with or without the `Schedule` prefix (ScheduleGPipe, \
         Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, \
         ScheduleZBVZeroBubble, ScheduleDualPipeV), everywhere a schedule is named. Pick zb-2p \
         when memory allows 2p microbatches' activations, else zb-1f1b (= zb-1p).",
    );
    out
}

/// Runs `plan`.
pub fn run(args: &PlanArgs) -> Result<(), String> {
    let kind = ScheduleKind::from_name(&args.schedule).map_err(cli_error)?;
    if args.pipeline.chunks.is_some() && kind.own_layout() != nobubble_schedule::OwnLayout::Looped {
        return Err(format!(
            "--chunks is for interleaved-1f1b and interleaved-zb; {} sets its own (leave it out)",
            kind.name()
        ));
    }
    let planned = plan(kind, &args.pipeline, &args.costs)?;
    planned.check_limit().map_err(cli_error)?;
    let (p, m) = (args.pipeline.stages, args.pipeline.microbatches);
    if kind == ScheduleKind::ZbAuto
        && args.costs.placement.placement().is_none()
        && 6 * p * m > nobubble_schedule::generate::V_CHOICE_MAX_ACTIONS
    {
        eprintln!(
            "note: zb-auto planned the linear placement only: the V search is left out above \
             {} passes per iteration to keep planning fast (this one has {}); --placement v \
             plans it",
            nobubble_schedule::generate::V_CHOICE_MAX_ACTIONS,
            6 * p * m
        );
    }
    let Planned {
        schedule,
        costs,
        sim,
        limit,
        objective,
        split,
        mem_limit,
        ..
    } = &planned;
    let out = match output_format(args) {
        // JSON: the report with what only `plan` knows added, serialized once.
        Format::Json => {
            let mut v = json_report(schedule, costs, sim, *limit);
            if let Some(per_rank) = mem_limit.per_rank(schedule.ranks) {
                // The budgets as given (the report's own are what the planner could use,
                // at most m microbatches' worth).
                v.fields
                    .insert("mem_budget".into(), serde_json::json!(per_rank));
            }
            if let Some(LayerSplit { counts, even }) = split {
                v.fields
                    .insert("layer_split".into(), serde_json::json!(counts));
                let even = match even {
                    Some((c, e)) => serde_json::json!({"layers": c,
                        "makespan": e.metrics.makespan, "bubble_rate": e.metrics.bubble_rate}),
                    None => serde_json::Value::Null,
                };
                v.fields.insert("even_split".into(), even);
            }
            json_text(v, *objective)
        }
        format => {
            let colour = use_colour(args.output.is_some());
            let mut out = render(
                format, schedule, costs, sim, *limit, *objective, args.width, colour,
            );
            if let (Format::Text, Some(split)) = (format, split) {
                out.push_str(&split_line(split, &planned));
            }
            out
        }
    };
    emit(args.output.as_deref(), &out)
}

/// The format asked for, else the one `-o`'s extension names (`.json` is the report; a
/// Chrome trace needs `-f chrome`), else text. A format that contradicts the extension is
/// written as asked, with a note.
fn output_format(args: &PlanArgs) -> Format {
    let by_extension = args
        .output
        .as_deref()
        .and_then(|p| p.extension())
        .and_then(
            |e| match e.to_string_lossy().to_ascii_lowercase().as_str() {
                "csv" => Some(Format::Csv),
                "svg" => Some(Format::Svg),
                "json" => Some(Format::Json),
                _ => None,
            },
        );
    match (args.format, by_extension) {
        (Some(f), Some(e)) if f != e && !(f == Format::Chrome && e == Format::Json) => {
            let name = |f: Format| format!("{f:?}").to_lowercase();
            eprintln!(
                "note: writing {} to {} as asked (its extension says {})",
                name(f),
                args.output
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                name(e)
            );
            f
        }
        (Some(f), _) => f,
        (None, Some(e)) => e,
        (None, None) => Format::Text,
    }
}

/// The text report's line on the layer split against the even one.
fn split_line(split: &LayerSplit, planned: &Planned) -> String {
    let join = |c: &[usize]| {
        c.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let m = &planned.sim.metrics;
    let versus = match &split.even {
        Some((c, e)) => format!(
            "the even split {} gives makespan {} (bubble rate {:.2}%)",
            join(c),
            fmt_num(e.metrics.makespan),
            100.0 * e.metrics.bubble_rate
        ),
        None => "the even split does not plan within these limits".to_string(),
    };
    format!(
        "layer split (blocks per stage): {}; {versus}, this one {} ({:.2}%)\n",
        join(&split.counts),
        fmt_num(m.makespan),
        100.0 * m.bubble_rate
    )
}
