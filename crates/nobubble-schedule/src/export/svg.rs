//! A picture of a simulated timeline, in the style of the paper's figures: one row per rank,
//! one block per pass scaled to its time, microbatch numbers inside, idle time visible.

use super::chunk_index;
use crate::action::Kind;
use crate::error::fmt_num;
use crate::schedule::Schedule;
use crate::sim::Simulation;
use std::fmt::Write;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 78.0;
const ROW: f64 = 26.0;
const GAP: f64 = 6.0;

/// Fill colour per pass kind; later chunks of a rank get a lighter shade.
fn colour(kind: Kind, chunk: usize) -> &'static str {
    let light = chunk % 2 == 1;
    match (kind, light) {
        (Kind::F, false) => "#4e79a7",
        (Kind::F, true) => "#8db3d9",
        (Kind::I, false) => "#3f9b4f",
        (Kind::I, true) => "#8fd19b",
        (Kind::W, false) => "#e8871e",
        (Kind::W, true) => "#f6c08a",
        (Kind::B, false) => "#8e5ea2",
        (Kind::B, true) => "#c5a3d4",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
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
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let peak = m.peak_memory.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="16" font-weight="bold">{} — {} stages on {} ranks, {} microbatches</text>"#,
        escape(&schedule.name),
        schedule.stages,
        schedule.ranks,
        schedule.microbatches
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="42" font-size="13">makespan {} · bubble rate {:.2}% · bubble fraction {:.2}% · peak memory {} · messages {}</text>"#,
        fmt_num(m.makespan),
        100.0 * m.bubble_rate,
        100.0 * m.bubble_fraction,
        fmt_num(peak),
        m.messages
    );
    // Legend.
    let used: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| schedule.orders.iter().flatten().any(|a| a.kind == *k))
        .collect();
    let mut x = LEFT;
    for k in used {
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="52" width="14" height="14" fill="{}"/><text x="{}" y="63" font-size="12">{} ({})</text>"#,
            colour(k, 0),
            x + 18.0,
            k.letter(),
            k.name()
        );
        x += 130.0;
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="52" width="14" height="14" fill="#eeeeee" stroke="#bbbbbb"/><text x="{}" y="63" font-size="12">idle</text>"##,
        x + 18.0
    );
    x += 70.0;
    let _ = writeln!(
        svg,
        r#"<rect x="{x}" y="52" width="14" height="14" fill="white" stroke="black" stroke-width="2"/><text x="{}" y="63" font-size="12">critical path</text>"#,
        x + 18.0
    );
    if schedule.stages > schedule.ranks {
        x += 120.0;
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="63" font-size="12">lighter shade: second chunk of a rank</text>"#
        );
    }
    let critical: std::collections::HashSet<_> = sim.critical_path.iter().copied().collect();
    for (rank, slots) in sim.timeline.iter().enumerate() {
        let y = TOP + rank as f64 * (ROW + GAP);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="end">rank {rank}</text>"#,
            LEFT - 8.0,
            y + ROW * 0.68
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{y}\" width=\"{}\" height=\"{ROW}\" fill=\"#eeeeee\"/>",
            m.makespan * scale
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
    // Time axis with about ten round ticks.
    let axis_y = TOP + rows_h + 4.0;
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="black"/>"#,
        LEFT + m.makespan * scale
    );
    let step = nice_step(m.makespan / 10.0);
    let mut t = 0.0;
    while t <= m.makespan * (1.0 + 1e-9) {
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
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">time (cost-model units)</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        axis_y + 36.0
    );
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
