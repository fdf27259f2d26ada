//! `nobubble bench …`: figures recorded in BENCHMARKS.md.

use clap::{Args, Subcommand};
use nobubble_schedule::paper::{bubble_rate, COMPARED, SETTINGS};
use nobubble_schedule::{generate, simulate, CostModel, CostSpec, RankCost, Request, ScheduleKind};
use serde_json::json;
use std::time::Instant;

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Our simulated bubble rates on the paper's 12 settings, beside the published ones.
    Paper {
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Time to validate and simulate one schedule, per generator.
    Sim(SimBenchArgs),
}

/// Arguments of `bench sim`.
#[derive(Args, Debug)]
pub struct SimBenchArgs {
    /// Pipeline stages.
    #[arg(long, short = 'p', default_value_t = 32)]
    pub stages: usize,
    /// Microbatches.
    #[arg(long, short = 'm', default_value_t = 256)]
    pub microbatches: usize,
    /// Timed repetitions per schedule (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub repeat: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark.
pub fn run(cmd: &BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Paper { json } => paper(*json),
        BenchCommand::Sim(a) => sim(a),
    }
}

fn paper(as_json: bool) -> Result<(), String> {
    let mut rows = Vec::new();
    for s in &SETTINGS {
        let mut ours = Vec::new();
        for (kind, col) in COMPARED {
            let r = bubble_rate(s, kind).map_err(|e| e.to_string())?;
            ours.push((kind.name(), r, s.reported[col]));
        }
        rows.push((s, ours));
    }
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|(s, ours)| {
                json!({"model": s.model, "p": s.p, "m": s.m, "t_f": s.t_f, "t_i": s.t_i,
                       "t_w": s.t_w, "t_comm": s.t_comm,
                       "schedules": ours.iter().map(|(n, o, p)| json!({"schedule": n, "ours": o, "paper": p})).collect::<Vec<_>>()})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializes")
        );
        return Ok(());
    }
    println!(
        "Bubble rate on the paper's settings (T_comm as a latency on every cross-rank hand-off)."
    );
    println!("ours / paper; |diff| in the last column.\n");
    println!(
        "{:<6} {:>3} {:>4}  {:>17}  {:>17}  {:>17}  {:>9}",
        "model", "p", "m", "1f1b", "zb-h1", "zb-h2", "max |diff|"
    );
    let mut worst: f64 = 0.0;
    for (s, ours) in &rows {
        let cells: Vec<String> = ours
            .iter()
            .map(|(_, o, p)| format!("{o:.4} / {p:.4}"))
            .collect();
        let diff = ours
            .iter()
            .map(|(_, o, p)| (o - p).abs())
            .fold(0.0, f64::max);
        worst = worst.max(diff);
        println!(
            "{:<6} {:>3} {:>4}  {:>17}  {:>17}  {:>17}  {:>9.4}",
            s.model, s.p, s.m, cells[0], cells[1], cells[2], diff
        );
    }
    println!("\nlargest difference over all rows: {worst:.2e}");
    Ok(())
}

fn sim(a: &SimBenchArgs) -> Result<(), String> {
    if a.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    let mut results = Vec::new();
    for kind in ScheduleKind::ALL {
        let schedule = match generate(&Request {
            kind,
            ranks: a.stages,
            microbatches: a.microbatches,
            chunks: 2,
        }) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping {}: {e}", kind.name());
                continue;
            }
        };
        let spec = CostSpec::uniform(RankCost::default(), 0.1);
        let costs = CostModel::for_schedule(&spec, &schedule).map_err(|e| e.to_string())?;
        let mut times = Vec::with_capacity(a.repeat);
        for _ in 0..a.repeat {
            let t0 = Instant::now();
            let sim = simulate(&schedule, &costs).map_err(|e| e.to_string())?;
            std::hint::black_box(&sim);
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        results.push((
            kind.name(),
            schedule.len(),
            times[times.len() / 2],
            times[0],
        ));
    }
    if a.json {
        let out: Vec<_> = results
            .iter()
            .map(|(n, len, med, min)| json!({"schedule": n, "actions": len, "median_ms": med, "min_ms": min}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializes")
        );
        return Ok(());
    }
    println!(
        "validate + simulate, p={} m={}, median of {} runs (release build expected)",
        a.stages, a.microbatches, a.repeat
    );
    println!(
        "{:<18} {:>8} {:>10} {:>10}",
        "schedule", "actions", "median ms", "min ms"
    );
    for (n, len, med, min) in results {
        println!("{n:<18} {len:>8} {med:>10.3} {min:>10.3}");
    }
    Ok(())
}
