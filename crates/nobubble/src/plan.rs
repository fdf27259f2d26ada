//! `nobubble plan`: generate, simulate, export.

use crate::costs::{plan, CostArgs, Planned};
use crate::report::{emit, render, use_colour, Format};
use clap::Args;
use nobubble_schedule::{check_memory, ScheduleKind};
use std::path::PathBuf;

/// Arguments of `plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-1p, zb-2p, zb-auto, zb-paper,
    /// interleaved-zb, zb-v, v-half, v-min, v-auto, dualpipe-v.
    #[arg(long, short = 's', default_value = "zb-h2")]
    pub schedule: String,
    /// Pipeline stages (ranks, devices).
    #[arg(long, short = 'p')]
    pub stages: usize,
    /// Microbatches per iteration.
    #[arg(long, short = 'm')]
    pub microbatches: usize,
    /// Model chunks per rank (interleaved-1f1b, interleaved-zb).
    #[arg(long, default_value_t = 2)]
    pub chunks: usize,
    #[command(flatten)]
    pub costs: CostArgs,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write to this file instead of stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Width of the text timeline in columns.
    #[arg(long, default_value_t = 100)]
    pub width: usize,
}

/// Runs `plan`.
pub fn run(args: &PlanArgs) -> Result<(), String> {
    let kind = ScheduleKind::from_name(&args.schedule).map_err(|e| e.to_string())?;
    let Planned {
        schedule,
        costs,
        sim,
    } = plan(
        kind,
        args.stages,
        args.microbatches,
        args.chunks,
        &args.costs,
    )?;
    if let Some(limit) = args.costs.mem_limit {
        check_memory(&schedule, &costs, limit).map_err(|e| e.to_string())?;
    }
    // The limit the schedule was planned under (automatic kinds) or checked against.
    let limit = kind
        .planning_limit(args.stages, args.costs.mem_limit)
        .or(args.costs.mem_limit);
    let colour = use_colour(args.output.is_some());
    let out = render(
        args.format,
        &schedule,
        &costs,
        &sim,
        limit,
        args.width,
        colour,
    );
    emit(args.output.as_deref(), &out)
}
