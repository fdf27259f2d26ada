//! `nobubble forecast`: what a training job costs in GPU-hours, days and money under each
//! schedule, from the FLOP model ([`nobubble_schedule::forecast`]).

use clap::Args;
use nobubble_schedule::forecast::{
    forecast, gpu_peak_flops, ForecastInput, ForecastRow, MemLimit, ModelShape, StepTime,
};
use serde_json::json;

/// Arguments of `forecast`.
#[derive(Args, Debug)]
pub struct ForecastArgs {
    /// Tokens to train on: a number, or with K, M, B or T (e.g. 300B, 1.5T).
    #[arg(long)]
    pub tokens: String,
    /// Model parameters (e.g. 7B), when the shape is unknown: F = I = W = 2 FLOPs per
    /// parameter and token. Give --layers, --hidden and --heads instead for the paper's
    /// per-layer counts and activation sizes.
    #[arg(long, conflicts_with_all = ["layers", "hidden", "heads"])]
    pub params: Option<String>,
    #[command(flatten)]
    pub shape: crate::costs::ModelShapeArgs,
    /// Vocabulary size: adds the LM head to the last stage (0 = leave it out).
    #[arg(long, default_value_t = 0)]
    pub vocab: usize,
    /// GPU model, for its published dense BF16 peak: A100, H100, H200, B200.
    #[arg(long, default_value = "A100")]
    pub gpu: String,
    /// Peak TFLOP/s of one GPU (overrides --gpu's figure).
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Fraction of the peak the passes reach outside the bubble (the non-pipeline part of
    /// MFU).
    #[arg(long, default_value_t = 0.5)]
    pub mfu: f64,
    /// Pipeline stages (ranks).
    #[arg(long, short = 'p', default_value_t = 8)]
    pub stages: usize,
    /// Microbatches per pipeline per step.
    #[arg(long, short = 'm', default_value_t = 16)]
    pub microbatches: usize,
    /// Data-parallel replicas [default: --gpus ÷ --stages, else 1].
    #[arg(long)]
    pub data_parallel: Option<usize>,
    /// GPUs in all (stages × data-parallel).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Price of one GPU-hour, in dollars.
    #[arg(long, default_value_t = 2.0)]
    pub usd_per_gpu_hour: f64,
    /// Time of one activation or gradient transfer between stages, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub comm_ms: f64,
    /// Activation memory per GPU: bytes with a suffix (40GiB, 80GB), or a bare number of
    /// microbatches' activations (multiples of M_B). zb-auto plans within it; fixed
    /// schedules over it are marked.
    #[arg(long, value_parser = crate::costs::parse_mem_limit)]
    pub mem_limit: Option<MemLimit>,
    /// What an iteration costs: span (post-validated optimizer steps let iterations overlap,
    /// `train --post-validate`) or makespan (a synchronous step).
    #[arg(long, value_enum, default_value_t = StepTimeArg::Span)]
    pub step_time: StepTimeArg,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `--step-time`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepTimeArg {
    /// Longest rank span.
    Span,
    /// Makespan.
    Makespan,
}

/// A count with an optional K/M/B/T suffix (powers of 1000).
fn count(flag: &str, text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('B') | Some('G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|v| v * mult)
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("{flag}: `{text}` is not a positive count; write e.g. 300B or 3e11"))
}

fn input(a: &ForecastArgs) -> Result<(ForecastInput, String), String> {
    let sh = &a.shape;
    let model = match (&a.params, sh.layers, sh.hidden, sh.heads) {
        (Some(p), ..) => ModelShape::Parameters(count("--params", p)?),
        (None, Some(layers), Some(hidden), Some(heads)) => ModelShape::Layers {
            layers,
            hidden,
            heads,
            vocab: a.vocab,
        },
        _ => {
            return Err(
                "describe the model: --params N (e.g. 7B), or --layers, --hidden and --heads"
                    .into(),
            )
        }
    };
    let (peak, gpu) = match a.peak_tflops {
        Some(t) if t.is_finite() && t > 0.0 => (t * 1e12, format!("GPUs of {t} TFLOP/s")),
        Some(t) => return Err(format!("--peak-tflops must be positive, got {t}")),
        None => (
            gpu_peak_flops(&a.gpu).ok_or_else(|| {
                format!(
                    "--gpu {}: unknown; use A100, H100, H200 or B200, or give --peak-tflops",
                    a.gpu
                )
            })?,
            a.gpu.to_ascii_uppercase(),
        ),
    };
    if a.gpus == Some(0) {
        return Err("--gpus must be at least 1".into());
    }
    let d = match (a.data_parallel, a.gpus) {
        (Some(d), Some(g)) if d.checked_mul(a.stages) != Some(g) => {
            return Err(format!(
                "--gpus {g} is not --stages {} × --data-parallel {d}; give one of them",
                a.stages
            ))
        }
        (Some(d), _) => d,
        (None, Some(g)) if a.stages > 0 && g % a.stages == 0 => g / a.stages,
        (None, Some(g)) => {
            return Err(format!(
                "--gpus {g} is not a multiple of --stages {}: each data-parallel replica is a whole pipeline",
                a.stages
            ))
        }
        (None, None) => 1,
    };
    let x = ForecastInput {
        model,
        seq_len: sh.seq_len.unwrap_or(1024),
        microbatch_size: sh.microbatch_size.unwrap_or(1),
        tokens: count("--tokens", &a.tokens)?,
        peak_flops: peak,
        mfu: a.mfu,
        stages: a.stages,
        microbatches: a.microbatches,
        data_parallel: d,
        usd_per_gpu_hour: a.usd_per_gpu_hour,
        comm_seconds: a.comm_ms / 1e3,
        mem_limit: a.mem_limit.clone().unwrap_or_default(),
        step_time: match a.step_time {
            StepTimeArg::Span => StepTime::Span,
            StepTimeArg::Makespan => StepTime::Makespan,
        },
    };
    Ok((x, gpu))
}

fn memory(v: f64, shaped: bool) -> String {
    if shaped {
        format!("{:.2} GiB", v / (1u64 << 30) as f64)
    } else {
        format!("{v:.1} M_B")
    }
}

/// Runs `forecast`.
pub fn run(a: &ForecastArgs) -> Result<(), String> {
    let (x, gpu) = input(a)?;
    let f = forecast(&x).map_err(crate::costs::cli_error)?;
    let rows = &f.rows;
    if a.json {
        let out = json!({
            "tokens": x.tokens,
            "gpus": x.stages as f64 * x.data_parallel as f64,
            "stages": x.stages,
            "microbatches": x.microbatches,
            "data_parallel": x.data_parallel,
            "peak_flops_per_gpu": x.peak_flops,
            "mfu": x.mfu,
            "usd_per_gpu_hour": x.usd_per_gpu_hour,
            "step_time": x.step_time,
            "schedules": rows,
            "omitted": f.omitted.iter().map(|(k, why)| json!({"schedule": k, "reason": why})).collect::<Vec<_>>(),
        });
        return crate::output::stdout(
            (serde_json::to_string_pretty(&out).expect("serializes") + "\n").as_bytes(),
        );
    }
    let shaped = matches!(x.model, ModelShape::Layers { .. });
    let model = match &x.model {
        ModelShape::Layers {
            layers,
            hidden,
            heads,
            vocab,
        } => {
            let head = if *vocab > 0 {
                format!(", vocabulary {vocab} on the last stage")
            } else {
                String::new()
            };
            // As the runtime splits them; a V row splits over twice as many chunks.
            let split_over = |n: usize| {
                let c = nobubble_schedule::split::even_counts(*layers, n);
                c.iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let v_rows = rows
                .iter()
                .any(|r| r.schedule == nobubble_schedule::ScheduleKind::ZbV.name());
            let mut uneven = Vec::new();
            if layers % x.stages != 0 {
                uneven.push(format!("{} over the stages", split_over(x.stages)));
            }
            if v_rows && layers % (2 * x.stages) != 0 {
                uneven.push(format!("{} over a V's chunks", split_over(2 * x.stages)));
            }
            let split = if uneven.is_empty() {
                String::new()
            } else {
                format!(" (split {})", uneven.join(", "))
            };
            format!("{layers} layers{split}, h {hidden}, {heads} heads{head}")
        }
        ModelShape::Parameters(n) => format!("{:.2} B parameters", n / 1e9),
    };
    let mut out = format!(
        "forecast: {model}, sequence {} × {}, {:.3e} tokens on {} {gpu} ({} stage{} × {} data-parallel; peak {:.0} TFLOP/s, {:.0}% of it outside the bubble), ${:.2} per GPU-hour\n\
         iteration time = {}\n\n",
        x.seq_len,
        x.microbatch_size,
        x.tokens,
        x.stages * x.data_parallel,
        x.stages,
        if x.stages == 1 { "" } else { "s" },
        x.data_parallel,
        x.peak_flops / 1e12,
        100.0 * x.mfu,
        x.usd_per_gpu_hour,
        match x.step_time {
            StepTime::Span => "the longest rank span (post-validated optimizer steps overlap iterations; --step-time makespan for a synchronous step)",
            StepTime::Makespan => "the makespan (a synchronous optimizer step)",
        }
    );
    out.push_str(&format!(
        "{:<10} {:>7} {:>9} {:>12} {:>8} {:>14} {:>8} {:>11}  {}\n",
        "schedule", "bubble", "step s", "GPU-hours", "days", "cost $", "saving", "act/GPU", "fits"
    ));
    for r in rows {
        out.push_str(&row(r, shaped));
    }
    for (k, why) in &f.omitted {
        out.push_str(&format!("{k:<10} left out: {why}\n"));
    }
    out.push_str(&format!(
        "\nGPU-hours and cost include the bubble; the MFU of a whole run is {:.0}% × (1 − bubble).\n",
        100.0 * x.mfu
    ));
    if x.mem_limit.is_none() {
        out.push_str("zb-auto planned at 2p microbatches' activations; give --mem-limit for your GPUs' memory.\n");
    }
    crate::output::stdout(out.as_bytes())
}

fn row(r: &ForecastRow, shaped: bool) -> String {
    format!(
        "{:<10} {:>6.2}% {:>9.3} {:>12.0} {:>8.1} {:>14.0} {:>7.1}% {:>11}  {}\n",
        r.schedule,
        100.0 * r.bubble,
        r.step_seconds,
        r.gpu_hours,
        r.days,
        r.cost,
        100.0 * r.saving_vs_1f1b,
        memory(r.peak_activation, shaped),
        if r.fits { "yes" } else { "no" }
    )
}
