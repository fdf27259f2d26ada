//! A timeline drawn in the terminal: ranks as rows, passes as labelled blocks scaled to time,
//! idle time as dots. Colour only when writing to a terminal.

use super::chunk_index;
use crate::action::Kind;
use crate::schedule::Schedule;
use crate::sim::Simulation;

/// ANSI background per kind; chunk ≥ 1 uses the bright variant.
fn ansi(kind: Kind, chunk: usize) -> &'static str {
    match (kind, chunk % 2 == 1) {
        (Kind::F, false) => "\x1b[44;97m",
        (Kind::F, true) => "\x1b[104;30m",
        (Kind::I, false) => "\x1b[42;97m",
        (Kind::I, true) => "\x1b[102;30m",
        (Kind::W, false) => "\x1b[43;30m",
        (Kind::W, true) => "\x1b[103;30m",
        (Kind::B, false) => "\x1b[45;97m",
        (Kind::B, true) => "\x1b[105;30m",
    }
}

/// Draws the timeline `width` columns wide. Each block starts with its kind letter and
/// microbatch (`F3`, `W12`), cut to the block's width; `.` is idle.
pub fn render(schedule: &Schedule, sim: &Simulation, width: usize, colour: bool) -> String {
    let width = width.max(10);
    let dt = sim.metrics.makespan / width as f64;
    let mut out = String::new();
    for (rank, slots) in sim.timeline.iter().enumerate() {
        let mut cells: Vec<(char, Option<(Kind, usize)>)> = vec![('.', None); width];
        for slot in slots {
            let a = slot.action;
            let c0 = ((slot.start / dt).round() as usize).min(width);
            let c1 = ((slot.end / dt).round() as usize)
                .min(width)
                .max(c0 + 1)
                .min(width);
            let label: Vec<char> = format!("{}{}", a.kind.letter(), a.microbatch)
                .chars()
                .collect();
            for (k, c) in (c0..c1).enumerate() {
                let ch = if c1 - c0 >= label.len() {
                    label.get(k).copied().unwrap_or(' ')
                } else if k == 0 {
                    a.kind.letter()
                } else {
                    ' '
                };
                cells[c] = (ch, Some((a.kind, chunk_index(schedule, a.stage))));
            }
        }
        out.push_str(&format!("rank {rank:>2} |"));
        let mut current: Option<(Kind, usize)> = None;
        for (ch, style) in cells {
            if colour && style != current {
                out.push_str("\x1b[0m");
                if let Some((k, c)) = style {
                    out.push_str(ansi(k, c));
                }
                current = style;
            }
            out.push(ch);
        }
        if colour {
            out.push_str("\x1b[0m");
        }
        out.push_str("|\n");
    }
    out
}
