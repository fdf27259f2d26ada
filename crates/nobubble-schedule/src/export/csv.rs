//! PyTorch's compute-only schedule CSV (`torch.distributed.pipelining`): no header, row r =
//! rank r, each cell one action `{stage}{F|I|W|B}{microbatch}` in program order, empty cells
//! are idle slots. Reading it lets `check` judge schedules written by someone else.

use crate::action::Action;
use crate::error::Error;
use crate::schedule::Schedule;

/// Largest stage or microbatch number a file may use.
const MAX_INDEX: usize = 1 << 20;

/// Writes one row per rank, actions in program order, no padding.
pub fn write(schedule: &Schedule) -> String {
    let mut out = String::new();
    for order in &schedule.orders {
        let cells: Vec<String> = order.iter().map(Action::to_string).collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Reads a compute-only CSV. The stage→rank placement comes from which row holds a stage;
/// the stage and microbatch counts from the largest indices seen. Structural rules (counts,
/// order) are left to the validator so its messages are the same for every source.
///
/// Sizes are bounded by the input: a leading UTF-8 byte-order mark is skipped, and indices
/// that would need more passes than the file holds (a valid schedule lists every stage's
/// every microbatch, twice or more) are refused before any table is sized by them — tables
/// are stages × microbatches ≤ the number of cells — so a small file can never ask for a
/// large allocation.
pub fn read(text: &str, name: &str) -> Result<Schedule, Error> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows: Vec<Vec<Action>> = text.lines().map(|_| Vec::new()).collect();
    for (r, line) in text.lines().enumerate() {
        for (c, cell) in line.split(',').enumerate() {
            let cell = cell.trim().trim_matches('"').trim();
            if cell.is_empty() {
                continue;
            }
            let a: Action = cell.parse().map_err(|e| {
                Error::Input(format!("row {} (rank {r}), column {}: {e}", r + 1, c + 1))
            })?;
            if a.stage >= MAX_INDEX || a.microbatch >= MAX_INDEX {
                return Err(Error::Input(format!(
                    "row {} (rank {r}), column {}: `{cell}` has a stage or microbatch number \
                     of {MAX_INDEX} or more; is the cell mistyped?",
                    r + 1,
                    c + 1
                )));
            }
            rows[r].push(a);
        }
    }
    while rows.last().is_some_and(Vec::is_empty) {
        rows.pop();
    }
    if let Some(r) = rows.iter().position(Vec::is_empty) {
        return Err(Error::Input(format!(
            "row {} (rank {r}) has no actions: every rank must hold a stage; remove the empty row",
            r + 1
        )));
    }
    if rows.is_empty() {
        return Err(Error::Input(
            "the schedule file has no actions; expected one row per rank with cells like 0F0,0F1,0B0".into(),
        ));
    }
    let stages = rows.iter().flatten().map(|a| a.stage).max().unwrap_or(0) + 1;
    let microbatches = rows
        .iter()
        .flatten()
        .map(|a| a.microbatch)
        .max()
        .unwrap_or(0)
        + 1;
    let actions: usize = rows.iter().map(Vec::len).sum();
    if stages.saturating_mul(microbatches) > actions {
        return Err(Error::Input(format!(
            "the file lists {actions} actions, but its stage numbers (up to {}) and microbatch \
             numbers (up to {}) need at least {} (every stage runs every microbatch); is a cell \
             mistyped?",
            stages - 1,
            microbatches - 1,
            stages as u128 * microbatches as u128
        )));
    }
    let mut placement = vec![usize::MAX; stages];
    for (r, row) in rows.iter().enumerate() {
        for a in row {
            let p = &mut placement[a.stage];
            if *p == usize::MAX {
                *p = r;
            } else if *p != r {
                return Err(Error::Invalid {
                    rank: r,
                    action: Some(*a),
                    reason: format!(
                        "stage {} also appears on rank {}; a stage lives on exactly one rank",
                        a.stage, *p
                    ),
                });
            }
        }
    }
    if let Some(s) = placement.iter().position(|&r| r == usize::MAX) {
        return Err(Error::Input(format!(
            "stage {s} is missing: no row holds it, but stages up to {} appear; \
             every stage from 0 to the largest needs its actions",
            stages - 1
        )));
    }
    Schedule::new(name, stages, rows.len(), microbatches, placement, rows)
}
