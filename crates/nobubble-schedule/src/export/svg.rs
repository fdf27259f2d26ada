//! A picture of a simulated timeline, in the style of the paper's figures: one row per rank,
//! one block per pass scaled to its time, microbatch numbers inside, idle time visible.

use super::chunk_index;
use crate::action::Action;
use crate::action::Kind;
use crate::error::fmt_num;
use crate::schedule::Schedule;
use crate::sim::Simulation;
use crate::sim::Slot;
use std::collections::HashSet;
use std::fmt::Write;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 78.0;
const ROW: f64 = 26.0;
const GAP: f64 = 6.0;

/// Fill colour per pass kind and chunk of a rank: the first chunk the base colour, the
/// second a lighter shade, then a darker and a palest one (cycling past four chunks).
fn colour(kind: Kind, chunk: usize) -> String {
    let (base, light) = match kind {
        Kind::F => ("#4e79a7", "#8db3d9"),
        Kind::I => ("#3f9b4f", "#8fd19b"),
        Kind::W => ("#e8871e", "#f6c08a"),
        Kind::B => ("#8e5ea2", "#c5a3d4"),
    };
    match chunk % 4 {
        0 => base.to_string(),
        1 => light.to_string(),
        2 => mix(base, 0.0, 0.35),
        _ => mix(light, 255.0, 0.5),
    }
}

/// `hex` moved `share` of the way towards the grey level `to` (0 black, 255 white).
fn mix(hex: &str, to: f64, share: f64) -> String {
    let channel = |i: usize| {
        let c = u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0) as f64;
        (c + (to - c) * share).round().clamp(0.0, 255.0) as u8
    };
    format!("#{:02x}{:02x}{:02x}", channel(1), channel(3), channel(5))
}

/// Text for SVG: markup escaped, and control characters (which XML cannot hold at all)
/// shown as U+FFFD.
fn escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && !matches!(c, '\t' | '\n') {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect::<String>()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the timeline; the summary line repeats the headline metrics so a picture pasted
/// into a report stands on its own.
pub fn render(schedule: &Schedule, sim: &Simulation) -> String {
    let m = &sim.metrics;
    let scale = (WIDTH - LEFT - RIGHT) / m.makespan.max(f64::MIN_POSITIVE);
    let rows_h = schedule.ranks as f64 * (ROW + GAP);
    let height = TOP + rows_h + 60.0;
    let mut svg = open(schedule, height, "");
    let peak = m.peak_memory.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="42" font-size="13">makespan {} · bubble rate {:.2}% · bubble fraction {:.2}% · peak memory {} · messages {}</text>"#,
        fmt_num(m.makespan),
        100.0 * m.bubble_rate,
        100.0 * m.bubble_fraction,
        fmt_num(peak),
        m.messages
    );
    legend(&mut svg, schedule, 52.0);
    let critical: HashSet<Action> = sim.critical_path.iter().copied().collect();
    draw_rows(
        &mut svg,
        schedule,
        &sim.timeline,
        &critical,
        TOP,
        scale,
        m.makespan,
    );
    draw_axis(
        &mut svg,
        TOP + rows_h + 4.0,
        scale,
        m.makespan,
        "time (cost-model units)",
    );
    svg.push_str("</svg>\n");
    svg
}

/// A picture's opening: the canvas and the title line naming the schedule, then `suffix`.
fn open(schedule: &Schedule, height: f64, suffix: &str) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="16" font-weight="bold">{} — {} on {}, {}{}</text>"#,
        escape(&schedule.name),
        crate::error::count(schedule.stages, "stage"),
        crate::error::count(schedule.ranks, "rank"),
        crate::error::count(schedule.microbatches, "microbatch"),
        escape(suffix)
    );
    svg
}

/// The colour key (pass kinds used, idle, critical path) at height `y`.
fn legend(svg: &mut String, schedule: &Schedule, y: f64) {
    let used: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| schedule.orders.iter().flatten().any(|a| a.kind == *k))
        .collect();
    let ty = y + 11.0;
    let mut x = LEFT;
    for k in used {
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{y}" width="14" height="14" fill="{}"/><text x="{}" y="{ty}" font-size="12">{} ({})</text>"#,
            colour(k, 0),
            x + 18.0,
            k.letter(),
            k.name()
        );
        x += 130.0;
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="{y}" width="14" height="14" fill="#eeeeee" stroke="#bbbbbb"/><text x="{}" y="{ty}" font-size="12">idle</text>"##,
        x + 18.0
    );
    x += 70.0;
    let _ = writeln!(
        svg,
        r#"<rect x="{x}" y="{y}" width="14" height="14" fill="white" stroke="black" stroke-width="2"/><text x="{}" y="{ty}" font-size="12">critical path</text>"#,
        x + 18.0
    );
    let chunks = schedule.stages.div_ceil(schedule.ranks.max(1));
    if chunks == 2 {
        x += 120.0;
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{ty}" font-size="12">lighter shade: second chunk of a rank</text>"#
        );
    } else if chunks > 2 {
        // One forward swatch per chunk shade.
        x += 120.0;
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{ty}" font-size="12">chunk of a rank:</text>"#
        );
        x += 100.0;
        for k in 0..chunks.min(4) {
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="{y}" width="14" height="14" fill="{}"/><text x="{}" y="{ty}" font-size="12">{k}</text>"#,
                colour(Kind::F, k),
                x + 18.0,
            );
            x += 40.0;
        }
        if chunks > 4 {
            let _ = writeln!(
                svg,
                r#"<text x="{x}" y="{ty}" font-size="12">(then again from 0)</text>"#
            );
        }
    }
}

/// One row per rank from `top`: the idle background up to `span`, then each pass.
fn draw_rows(
    svg: &mut String,
    schedule: &Schedule,
    timeline: &[Vec<Slot>],
    critical: &HashSet<Action>,
    top: f64,
    scale: f64,
    span: f64,
) {
    for (rank, slots) in timeline.iter().enumerate() {
        let y = top + rank as f64 * (ROW + GAP);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="end">rank {rank}</text>"#,
            LEFT - 8.0,
            y + ROW * 0.68
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{y}\" width=\"{}\" height=\"{ROW}\" fill=\"#eeeeee\"/>",
            span * scale
        );
        for slot in slots {
            let a = slot.action;
            let x0 = LEFT + slot.start * scale;
            let w = ((slot.end - slot.start) * scale).max(0.5);
            let stroke = if critical.contains(&a) {
                r#" stroke="black" stroke-width="1.5""#
            } else {
                r#" stroke="white" stroke-width="0.5""#
            };
            let _ = writeln!(
                svg,
                r#"<rect x="{x0:.2}" y="{y}" width="{w:.2}" height="{ROW}" fill="{}"{stroke}><title>{a}: {} → {}</title></rect>"#,
                colour(a.kind, chunk_index(schedule, a.stage)),
                fmt_num(slot.start),
                fmt_num(slot.end)
            );
            let label = a.microbatch.to_string();
            let font = (w / (label.len() as f64 * 0.62)).min(12.0);
            if font >= 6.0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.2}" y="{:.2}" font-size="{font:.1}" fill="white" text-anchor="middle">{label}</text>"#,
                    x0 + w / 2.0,
                    y + ROW / 2.0 + font * 0.35
                );
            }
        }
    }
}

/// A time axis at height `axis_y` from 0 to `span`, with about ten round ticks.
fn draw_axis(svg: &mut String, axis_y: f64, scale: f64, span: f64, unit: &str) {
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="black"/>"#,
        LEFT + span * scale
    );
    let step = nice_step(span / 10.0);
    let mut t = 0.0;
    while t <= span * (1.0 + 1e-9) {
        let tx = LEFT + t * scale;
        let _ = writeln!(
            svg,
            r#"<line x1="{tx:.2}" y1="{axis_y}" x2="{tx:.2}" y2="{}" stroke="black"/><text x="{tx:.2}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            axis_y + 5.0,
            axis_y + 18.0,
            fmt_num(t)
        );
        t += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        axis_y + 36.0,
        escape(unit)
    );
}

/// A measured timeline (`measured`, e.g. one training step, in ms) drawn above the
/// simulator's plan for the same schedule (`plan`, same unit), on one time scale, so a reader
/// sees where the run departed from the plan. `titles` name the two panels: what was
/// measured, and what the plan was simulated on.
pub fn render_measured(
    schedule: &Schedule,
    measured: &[Vec<Slot>],
    plan: &Simulation,
    titles: [&str; 2],
) -> String {
    let measured_span = measured.iter().flatten().map(|s| s.end).fold(0.0, f64::max);
    let span = measured_span.max(plan.metrics.makespan);
    let scale = (WIDTH - LEFT - RIGHT) / span.max(f64::MIN_POSITIVE);
    let rows_h = schedule.ranks as f64 * (ROW + GAP);
    let panel = 28.0 + rows_h;
    let height = TOP + 2.0 * panel + 60.0;
    let mut svg = open(schedule, height, ": measured vs planned");
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="42" font-size="13">measured span {:.2} · plan's makespan {:.2} ({:+.1}%) · plan's bubble fraction {:.2}%</text>"#,
        measured_span,
        plan.metrics.makespan,
        100.0 * (measured_span / plan.metrics.makespan.max(f64::MIN_POSITIVE) - 1.0),
        100.0 * plan.metrics.bubble_fraction
    );
    legend(&mut svg, schedule, 52.0);
    let plan_critical: HashSet<Action> = plan.critical_path.iter().copied().collect();
    let panels = [
        (titles[0], measured, measured_span, HashSet::new()),
        (
            titles[1],
            &plan.timeline[..],
            plan.metrics.makespan,
            plan_critical,
        ),
    ];
    for (k, (label, timeline, end, critical)) in panels.iter().enumerate() {
        let top = TOP + k as f64 * panel;
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
            top + 14.0,
            escape(label)
        );
        draw_rows(
            &mut svg,
            schedule,
            timeline,
            critical,
            top + 22.0,
            scale,
            *end,
        );
    }
    draw_axis(&mut svg, TOP + 2.0 * panel + 4.0, scale, span, "time (ms)");
    svg.push_str("</svg>\n");
    svg
}

/// A round tick spacing (1, 2 or 5 × 10^k) near `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let f = if r < 1.5 {
        1.0
    } else if r < 3.5 {
        2.0
    } else if r < 7.5 {
        5.0
    } else {
        10.0
    };
    f * mag
}
