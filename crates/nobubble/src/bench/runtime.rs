//! `nobubble bench runtime`: the runtime measured against the simulator — emulated compute
//! on 8–16 ranks, and real compute on 2 ranks.

use clap::Args;
use nobubble_nn::{AdamWConfig, Corpus, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::training::{self, TrainJob, TrainReport};
use nobubble_runtime::{launch, median_pass_ms, Compute, RunConfig, SessionOptions, StepRecord};
use nobubble_schedule::{
    simulate, CostModel, CostSpec, MemLimit, Objective, RankCost, ScheduleKind,
};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `bench runtime`.
#[derive(Args, Debug)]
pub struct RuntimeBenchArgs {
    /// Schedules to run.
    #[arg(long, default_value = "1f1b,zb-h1,zb-2p,zb-v")]
    pub schedules: String,
    /// Rank counts for the emulated part.
    #[arg(long, default_value = "8,16")]
    pub emulated_ranks: String,
    /// Emulated pass time (F = I = W) in milliseconds.
    #[arg(long, default_value_t = 2.0)]
    pub pass_ms: f64,
    /// Steps per measurement (the first is dropped as warm-up; the median is kept).
    #[arg(long, default_value_t = 5)]
    pub steps: u64,
    /// Steps of real training per schedule in the 2-rank part (0 skips it).
    #[arg(long, default_value_t = 12)]
    pub real_steps: u64,
    /// Model preset for the real part.
    #[arg(long, default_value = "tiny")]
    pub model: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Trains `steps` steps on threads and returns rank 0's report (re-planning automatic
/// schedules after two steps for real compute).
fn train(
    kind: ScheduleKind,
    p: usize,
    m: usize,
    model: GptConfig,
    emulated: Option<CostSpec>,
    steps: u64,
) -> Result<TrainReport, String> {
    let real = emulated.is_none();
    let job = TrainJob {
        session: SessionOptions {
            run: RunConfig {
                model,
                train: TrainConfig {
                    microbatches: m,
                    optimizer: AdamWConfig {
                        lr: 1e-3,
                        ..AdamWConfig::default()
                    },
                    ..TrainConfig::default()
                },
                layout: StageLayout::Even,
                compute: Compute::Real,
                recv_timeout: Duration::from_secs(60),
                fault: None,
                post_validate: None,
                data_parallel: 1,
            },
            kind,
            file: None,
            ranks: p,
            chunks: 2,
            mem_limit: MemLimit::None,
            emulated,
            collective_ms: 0.0,
            // A synchronous optimizer step: every iteration pays the makespan.
            objective: Objective::Makespan,
            plans: Default::default(),
        },
        steps,
        replan_after: if real { 2 } else { 0 },
        eval_sets: 0,
        save: None,
        save_every: 0,
        keep_last: 0,
        resume: None,
        init_from: None,
        tokenizer: None,
        corpus: Arc::new(Corpus::builtin()),
        eval: Arc::new(Corpus::builtin()),
        stop: None,
        max_nan_steps: 0,
        overwrite: false,
    };
    // No lent cores: the pass times are compared with the simulator's, which models each
    // rank alone.
    launch::threads(p, None, |ctx| training::run(&job, ctx, None))
        .map_err(|e| e.to_string())?
        .into_iter()
        .flatten()
        .next()
        .ok_or_else(|| "internal: rank 0 made no report".into())
}

/// Median pass times (ms) of the measured steps, per stage.
fn profiled(records: &[StepRecord], stages: usize) -> CostModel {
    let ms = |x: Option<f64>| x.unwrap_or(0.0);
    CostModel {
        comm: 0.0,
        objective: Default::default(),
        rank_share: Vec::new(),
        stages: median_pass_ms(records, stages)
            .into_iter()
            .map(|[f, i, w, _]| RankCost {
                f: ms(f),
                i: ms(i),
                w: ms(w),
                mem_b: 1.0,
                mem_w: 0.5,
                b: None,
            })
            .collect(),
    }
}

/// Runs `bench runtime`.
pub fn run(a: &RuntimeBenchArgs) -> Result<(), String> {
    let kinds: Vec<ScheduleKind> = a
        .schedules
        .split(',')
        .map(|n| ScheduleKind::from_name(n).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    emulated_table(a, &kinds)?;
    if a.real_steps == 0 {
        return Ok(());
    }
    real_table(a, &kinds)
}

/// The emulated-compute table: measured against simulated step makespans per schedule and
/// pipeline depth.
fn emulated_table(a: &RuntimeBenchArgs, kinds: &[ScheduleKind]) -> Result<(), String> {
    let steps = a.steps.max(2);
    println!(
        "emulated compute: passes of {} ms (F = I = W), m = 4p; step makespan, median of {} steps",
        a.pass_ms,
        steps - 1
    );
    println!(
        "{:<10} {:>4} {:>5} {:>13} {:>14} {:>8}",
        "schedule", "p", "m", "measured ms", "simulated ms", "diff"
    );
    for p in a.emulated_ranks.split(',') {
        let p: usize = p
            .trim()
            .parse()
            .map_err(|_| format!("--emulated-ranks: `{p}` is not a number"))?;
        let m = 4 * p;
        for &kind in kinds {
            let spec = CostSpec::uniform(
                RankCost {
                    f: a.pass_ms,
                    i: a.pass_ms,
                    w: a.pass_ms,
                    mem_b: 1.0,
                    mem_w: 0.5,
                    b: None,
                },
                0.0,
            );
            let r = train(kind, p, m, GptConfig::micro(), Some(spec), steps)?;
            let measured = median(r.tail.iter().map(|x| x.makespan * 1e3).collect());
            let simulated = r.plan.simulated_makespan;
            println!(
                "{:<10} {p:>4} {m:>5} {measured:>13.2} {simulated:>14.2} {:>+7.2}%",
                kind.name(),
                100.0 * (measured / simulated - 1.0)
            );
        }
    }
    Ok(())
}

/// The simulator's speedup of `schedule` over 1F1B on the profiled costs `c`; `None` when
/// the costs do not describe the schedule's stages or a plan fails.
fn simulated_speedup(
    c: &CostModel,
    schedule: &nobubble_schedule::Schedule,
    p: usize,
    m: usize,
) -> Option<f64> {
    let c1 = nobubble_schedule::generate(
        &nobubble_schedule::Request::new(ScheduleKind::OneFOneB, p, m),
        &CostSpec::uniform(RankCost::default(), 0.0),
    )
    .ok()?;
    let cm = |s: &nobubble_schedule::Schedule| (s.stages == c.stages.len()).then(|| c.clone());
    let base_sim = simulate(&c1, &cm(&c1)?).ok()?.metrics.makespan;
    let this = simulate(schedule, &cm(schedule)?).ok()?.metrics.makespan;
    Some(base_sim / this)
}

/// The real-compute table: each schedule's measured speedup over 1F1B beside the speedup
/// the simulator predicts from the profiled pass times.
fn real_table(a: &RuntimeBenchArgs, kinds: &[ScheduleKind]) -> Result<(), String> {
    let model = GptConfig::preset(&a.model).map_err(|e| e.to_string())?;
    let (p, m) = (2, 8);
    println!("\nreal compute: model {}, p = {p}, m = {m}, one thread per rank; step makespan, median of the steps run under the final plan (re-planned after 2; the first step dropped)", a.model);
    let mut results = Vec::new();
    for kind in std::iter::once(ScheduleKind::OneFOneB).chain(
        kinds
            .iter()
            .copied()
            .filter(|k| *k != ScheduleKind::OneFOneB),
    ) {
        let r = train(kind, p, m, model.clone(), None, a.real_steps.max(4))?;
        let tail = r.tail.clone();
        let measured = median(tail.iter().map(|r| r.makespan * 1e3).collect());
        let tokens = (m * model.microbatch_size * model.seq_len) as f64;
        let tps = tokens / median(tail.iter().map(|r| r.wall).collect());
        results.push((kind, measured, tps, r.plan.schedule.clone(), tail));
    }
    // Simulator's prediction from profiled costs: the split passes measured under a
    // zero-bubble schedule (1F1B fuses I and W, so its own profile cannot split them).
    let zb_profile = results
        .iter()
        .find(|r| r.0 != ScheduleKind::OneFOneB && r.3.uses_split_backward())
        .map(|r| profiled(&r.4, r.3.stages));
    let base = results[0].1;
    println!(
        "{:<10} {:>11} {:>10} {:>17} {:>18} {:>9}",
        "schedule", "step ms", "tokens/s", "measured speedup", "simulated speedup", "ratio"
    );
    for (kind, measured, tps, schedule, _) in &results {
        let sim = zb_profile
            .as_ref()
            .and_then(|c| simulated_speedup(c, schedule, p, m));
        let speedup = base / measured;
        println!(
            "{:<10} {:>11.2} {:>10.0} {:>16.3}x {:>17} {:>9}",
            kind.name(),
            measured,
            tps,
            speedup,
            sim.map(|s| format!("{s:.3}x"))
                .unwrap_or_else(|| "-".into()),
            sim.map(|s| format!("{:.0}%", 100.0 * (speedup - 1.0) / (s - 1.0).max(1e-9)))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!("\nratio = (measured speedup − 1) / (simulated speedup − 1): the share of the predicted gain realised.");
    Ok(())
}
