//! Shared output for `plan` and `check`: the JSON report, the text summary and where to
//! write them.

use nobubble_schedule::error::fmt_num;
use nobubble_schedule::export::{chrome, csv, svg, text};
use nobubble_schedule::{
    lower_bound, span_lower_bound, Action, CostModel, Objective, Placement, Schedule, Simulation,
    Slot,
};
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};
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

/// The JSON report: stable field names scripts can rely on. The two per-action lists
/// (`actions`, `timeline`) serialize straight from the schedule and its simulation: as a tree
/// of JSON values they took about 2 KB per action, and a pipeline at the planner's size limit
/// could not be printed. The other fields are a map the caller may add to.
pub struct JsonReport<'a> {
    schedule: &'a Schedule,
    sim: &'a Simulation,
    /// Every field but `actions` and `timeline` (which sort first and last among them).
    pub fields: Map<String, Value>,
}

/// The report of `schedule` as simulated by `sim` under `costs` and the limit.
pub fn json_report<'a>(
    schedule: &'a Schedule,
    costs: &CostModel,
    sim: &'a Simulation,
    mem_limit: Option<f64>,
) -> JsonReport<'a> {
    let m = &sim.metrics;
    let bound = lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let span_bound = span_lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let max_span = m.span.iter().copied().fold(0.0, f64::max);
    let fields = json!({
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
        "gap": gap(m.makespan, bound),
        "span_lower_bound": span_bound,
        "span_gap": gap(max_span, span_bound),
        "comm": costs.comm,
        "critical_path": sim.critical_path.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "placement": schedule.placement,
    });
    let Value::Object(fields) = fields else {
        unreachable!("json! of braces is an object")
    };
    JsonReport {
        schedule,
        sim,
        fields,
    }
}

impl Serialize for JsonReport<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Report<'a> {
            actions: Actions<'a>,
            #[serde(flatten)]
            fields: &'a Map<String, Value>,
            timeline: Timeline<'a>,
        }
        debug_assert!(self
            .fields
            .keys()
            .all(|k| k.as_str() > "actions" && k.as_str() < "timeline"));
        Report {
            actions: Actions(&self.schedule.orders),
            fields: &self.fields,
            timeline: Timeline(&self.sim.timeline),
        }
        .serialize(serializer)
    }
}

/// Per rank, its actions as text (`0F3`).
struct Actions<'a>(&'a [Vec<Action>]);

impl Serialize for Actions<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Rank<'a>(&'a [Action]);
        impl Serialize for Rank<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(Action::to_string))
            }
        }
        serializer.collect_seq(self.0.iter().map(|o| Rank(o)))
    }
}

/// Per rank, its simulated slots.
struct Timeline<'a>(&'a [Vec<Slot>]);

impl Serialize for Timeline<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct SlotJson {
            action: String,
            end: f64,
            start: f64,
        }
        struct Rank<'a>(&'a [Slot]);
        impl Serialize for Rank<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(|s| SlotJson {
                    action: s.action.to_string(),
                    end: s.end,
                    start: s.start,
                }))
            }
        }
        serializer.collect_seq(self.0.iter().map(|o| Rank(o)))
    }
}

/// The JSON report as printed, with the objective an automatic schedule was planned for.
pub fn json_text(mut report: JsonReport<'_>, planned_for: Option<Objective>) -> String {
    report
        .fields
        .insert("objective".into(), planned_for.map(|o| o.name()).into());
    let mut s = serde_json::to_string_pretty(&report).expect("report serializes");
    s.push('\n');
    s
}

/// `v` to `digits` significant digits: a budget rebuilt as `x × share × M_B` prints as the
/// bytes it was given, not with a last-place residue (`52076478464.00001`).
fn round_digits(v: f64, digits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - v.abs().log10().ceil() as i32);
    (v * scale).round() / scale
}

/// A limit of `x` × M_B beside the peak, which is in the costs' memory unit: the amount too
/// when every rank's M_B is the same.
fn limit_in_units(schedule: &Schedule, costs: &CostModel, x: f64) -> String {
    let amounts: Vec<f64> = (0..schedule.ranks)
        .map(|r| round_digits(costs.rank_limit(schedule, r, x), 12))
        .collect();
    if amounts.iter().all(|a| *a == amounts[0]) {
        format!(" (limit {} × M_B = {})", fmt_num(x), fmt_num(amounts[0]))
    } else {
        format!(" (limit {} × each rank's M_B)", fmt_num(x))
    }
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
    // Under per-rank budgets (given in memory, or a layer split held to the even split's
    // bytes) each rank's own budget stands beside its peak.
    let budget = |r: usize| match mem_limit {
        Some(x) if !costs.rank_share.is_empty() => {
            format!(
                " {:>11}",
                fmt_num(round_digits(costs.rank_limit(schedule, r, x), 12))
            )
        }
        _ => String::new(),
    };
    out.push_str(&format!(
        "rank  stages        busy        idle        span   peak mem{}\n",
        if budget(0).is_empty() {
            ""
        } else {
            "      budget"
        }
    ));
    for r in 0..schedule.ranks {
        let stages: Vec<String> = schedule
            .stages_of(r)
            .iter()
            .map(|s| s.to_string())
            .collect();
        out.push_str(&format!(
            "{r:>4}  {:<8} {:>11} {:>11} {:>11} {:>10}{}\n",
            stages.join(","),
            fmt_num(m.busy[r]),
            fmt_num(m.idle[r]),
            fmt_num(m.span[r]),
            fmt_num(m.peak_memory[r]),
            budget(r),
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
            Some(l) => limit_in_units(schedule, costs, l),
            None => String::new(),
        },
        m.messages
    ));
    let bound = lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    out.push_str(&format!(
        "lower bound on the makespan on this placement {} (this schedule is {:.2}% above it)\n",
        fmt_num(bound),
        100.0 * gap(m.makespan, bound)
    ));
    let span_bound = span_lower_bound(&schedule.placement, schedule.microbatches, costs, mem_limit);
    let max_span = m.span.iter().copied().fold(0.0, f64::max);
    out.push_str(&format!(
        "lower bound on the longest rank span on this placement {} (this schedule is {:.2}% above it)\n",
        fmt_num(span_bound),
        100.0 * gap(max_span, span_bound)
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
            use nobubble_schedule::error::count;
            let mut out = format!(
                "{} — {} on {}{placement}, {}\n",
                schedule.name,
                count(schedule.stages, "stage"),
                count(schedule.ranks, "rank"),
                count(schedule.microbatches, "microbatch")
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
        Format::Json => json_text(json_report(schedule, costs, sim, mem_limit), planned_for),
        Format::Csv => csv::write(schedule),
        Format::Chrome => {
            let mut s = chrome::to_json(schedule, sim);
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
            note_written(path);
            Ok(())
        }
    }
}

/// Says on stderr that `path` was written (not for stdout or stderr themselves).
pub fn note_written(path: &Path) {
    if !["-", "/dev/stdout", "/dev/stderr"].contains(&path.to_string_lossy().as_ref()) {
        crate::output::tell!("wrote {}", path.display());
    }
}

/// How far `value` is above its lower bound, as a fraction; a bound that exceeds the value
/// only by float rounding (a relative 1e-9: the two sum the same costs in another order)
/// counts as met, so the report never says "-0.00% above".
fn gap(value: f64, bound: f64) -> f64 {
    let g = value / bound - 1.0;
    if g < 0.0 && g > -1e-9 {
        0.0
    } else {
        g
    }
}
