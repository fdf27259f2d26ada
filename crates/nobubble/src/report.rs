//! Shared output for `plan` and `check`: the JSON report, the text summary and where to
//! write them.

use nobubble_schedule::error::fmt_num;
use nobubble_schedule::export::{chrome, csv, svg, text};
use nobubble_schedule::{
    lower_bound, span_lower_bound, CostModel, Objective, Placement, Schedule, Simulation,
};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::Path;

/// Output formats of `plan` and `check`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Terminal timeline and summary.
    Text,
    /// Machine-readable report with metrics and the timeline.
    Json,
    /// PyTorch's compute-only schedule CSV.
    Csv,
    /// Chrome/Perfetto trace of the simulated timeline.
    Chrome,
    /// SVG picture of the timeline.
    Svg,
}

/// The JSON report: stable field names scripts can rely on.
pub fn json_report(
    schedule: &Schedule,
    costs: &CostModel,
    sim: &Simulation,
    mem_limit: Option<f64>,
) -> Value {
    let m = &sim.metrics;
    let bound = lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let span_bound = span_lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let max_span = m.span.iter().copied().fold(0.0, f64::max);
    json!({
        "schedule": schedule.name,
        "stages": schedule.stages,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "chunks_per_rank": schedule.chunks_per_rank(),
        "makespan": m.makespan,
        "bubble_rate": m.bubble_rate,
        "bubble_fraction": m.bubble_fraction,
        "peak_memory": m.peak_memory,
        "mem_limit": if costs.rank_share.is_empty() { mem_limit } else { None },
        "mem_budget": mem_limit.filter(|_| !costs.rank_share.is_empty()).map(|x| {
            (0..schedule.ranks).map(|r| costs.rank_limit(schedule, r, x)).collect::<Vec<_>>()
        }),
        "busy": m.busy,
        "idle": m.idle,
        "span": m.span,
        "messages": m.messages,
        "lower_bound": bound,
        "gap": m.makespan / bound - 1.0,
        "span_lower_bound": span_bound,
        "span_gap": max_span / span_bound - 1.0,
        "comm": costs.comm,
        "critical_path": sim.critical_path.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "placement": schedule.placement,
        "actions": schedule.orders.iter()
            .map(|o| o.iter().map(|a| a.to_string()).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        "timeline": sim.timeline.iter().map(|slots| slots.iter()
            .map(|s| json!({"action": s.action.to_string(), "start": s.start, "end": s.end}))
            .collect::<Vec<_>>()).collect::<Vec<_>>(),
    })
}

/// The JSON report as printed, with the objective an automatic schedule was planned for.
pub fn json_text(report: &Value, planned_for: Option<Objective>) -> String {
    let mut report = report.clone();
    report["objective"] = planned_for.map(|o| o.name()).into();
    let mut s = serde_json::to_string_pretty(&report).expect("report serializes");
    s.push('\n');
    s
}

/// The per-rank table and headline metrics printed under a text timeline.
pub fn text_summary(
    schedule: &Schedule,
    costs: &CostModel,
    sim: &Simulation,
    mem_limit: Option<f64>,
) -> String {
    let m = &sim.metrics;
    let mut out = String::new();
    out.push_str("rank  stages        busy        idle        span   peak mem\n");
    for r in 0..schedule.ranks {
        let stages: Vec<String> = schedule
            .stages_of(r)
            .iter()
            .map(|s| s.to_string())
            .collect();
        out.push_str(&format!(
            "{r:>4}  {:<8} {:>11} {:>11} {:>11} {:>10}\n",
            stages.join(","),
            fmt_num(m.busy[r]),
            fmt_num(m.idle[r]),
            fmt_num(m.span[r]),
            fmt_num(m.peak_memory[r]),
        ));
    }
    let peak = m.peak_memory.iter().copied().fold(0.0, f64::max);
    out.push_str(&format!(
        "\nmakespan {}   bubble rate {:.2}%   bubble fraction {:.2}%   peak memory {}{}   messages {}\n",
        fmt_num(m.makespan),
        100.0 * m.bubble_rate,
        100.0 * m.bubble_fraction,
        fmt_num(peak),
        match mem_limit {
            Some(_) if !costs.rank_share.is_empty() => " (within each rank's budget)".to_string(),
            Some(l) => format!(" (limit {})", fmt_num(l)),
            None => String::new(),
        },
        m.messages
    ));
    let bound = lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    out.push_str(&format!(
        "lower bound on the makespan {} (this schedule is {:.2}% above it)\n",
        fmt_num(bound),
        100.0 * (m.makespan / bound - 1.0)
    ));
    let span_bound = span_lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let max_span = m.span.iter().copied().fold(0.0, f64::max);
    out.push_str(&format!(
        "lower bound on the longest rank span {} (this schedule is {:.2}% above it)\n",
        fmt_num(span_bound),
        100.0 * (max_span / span_bound - 1.0)
    ));
    out.push_str(&format!(
        "critical path: {} actions, {} … {}\n",
        sim.critical_path.len(),
        sim.critical_path
            .first()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        sim.critical_path
            .last()
            .map(|a| a.to_string())
            .unwrap_or_default(),
    ));
    out
}

/// Whether to colour terminal output: only on a terminal, and never under NO_COLOR.
pub fn use_colour(to_file: bool) -> bool {
    !to_file && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// One schedule in `format`; `planned_for` is the objective an automatic schedule was
/// planned for (`None` for fixed patterns and files).
#[allow(clippy::too_many_arguments)]
pub fn render(
    format: Format,
    schedule: &Schedule,
    costs: &CostModel,
    sim: &Simulation,
    mem_limit: Option<f64>,
    planned_for: Option<Objective>,
    width: usize,
    colour: bool,
) -> String {
    match format {
        Format::Text => {
            let placement = match Placement::of(schedule) {
                Some(Placement::V) => " (V placement)",
                _ => "",
            };
            let mut out = format!(
                "{} — {} stages on {} ranks{placement}, {} microbatches\n",
                schedule.name, schedule.stages, schedule.ranks, schedule.microbatches
            );
            out.push_str(&text::render(schedule, sim, width, colour));
            out.push('\n');
            out.push_str(&text_summary(schedule, costs, sim, mem_limit));
            if let Some(o) = planned_for {
                out.push_str(&format!(
                    "planned for the {} (--objective {})\n",
                    match o {
                        Objective::Span => "longest rank span, then the makespan",
                        Objective::Makespan => "makespan, then the longest rank span",
                    },
                    o.name()
                ));
            }
            out
        }
        Format::Json => json_text(&json_report(schedule, costs, sim, mem_limit), planned_for),
        Format::Csv => csv::write(schedule),
        Format::Chrome => {
            let mut s =
                serde_json::to_string(&chrome::trace(schedule, sim)).expect("trace serializes");
            s.push('\n');
            s
        }
        Format::Svg => svg::render(schedule, sim),
    }
}

/// Writes to `-o FILE` ([`crate::output::write`]: regular files atomically, devices and FIFOs
/// through, symlinks followed) or stdout.
pub fn emit(output: Option<&Path>, content: &str) -> Result<(), String> {
    match output {
        None => crate::output::stdout(content.as_bytes()),
        Some(path) => {
            crate::output::write(path, content.as_bytes())?;
            if !["-", "/dev/stdout", "/dev/stderr"].contains(&path.to_string_lossy().as_ref()) {
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}
