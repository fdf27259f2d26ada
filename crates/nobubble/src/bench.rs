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
    println!("Bubble rate on the paper's settings, ours / paper's. T_comm is a latency on every");
    println!("cross-rank hand-off; zb-1p and zb-2p plan under p·M_B and 2p·M_B with the paper's");
    println!("M_W/M_B = 32h / (34h + 5as).\n");
    println!(
        "{:<6} {:>3} {:>4}  {:>15}  {:>15}  {:>15}  {:>15}  {:>15}",
        "model", "p", "m", "1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p"
    );
    let mut worst: f64 = 0.0;
    let mut wins = [0usize; 2];
    for (s, ours) in &rows {
        let cells: Vec<String> = ours
            .iter()
            .map(|(_, o, p)| format!("{o:.4} / {p:.4}"))
            .collect();
        worst = ours[..3]
            .iter()
            .map(|(_, o, p)| (o - p).abs())
            .fold(worst, f64::max);
        for (k, (_, o, p)) in ours[3..].iter().enumerate() {
            if *o <= p + 5e-5 {
                wins[k] += 1;
            }
        }
        println!(
            "{:<6} {:>3} {:>4}  {:>15}  {:>15}  {:>15}  {:>15}  {:>15}",
            s.model, s.p, s.m, cells[0], cells[1], cells[2], cells[3], cells[4]
        );
    }
    println!("\nhandcrafted schedules (1f1b, zb-h1, zb-h2): largest difference {worst:.2e}");
    println!(
        "automatic: zb-1p at or below the paper in {}/12 rows, zb-2p in {}/12 rows",
        wins[0], wins[1]
    );

    Ok(())
}

fn sim(a: &SimBenchArgs) -> Result<(), String> {
    if a.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    let mut results = Vec::new();
    for kind in ScheduleKind::ALL {
        let spec = CostSpec::uniform(RankCost::default(), 0.1);
        let schedule = match generate(&Request::new(kind, a.stages, a.microbatches), &spec) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping {}: {e}", kind.name());
                continue;
            }
        };
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
