//! What a training job costs under each schedule (`nobubble forecast`): pass times from the
//! paper's FLOP counts (REFERENCE §1) and an achieved-MFU assumption, each schedule planned
//! and simulated, and the job's GPU-hours, days and price against 1F1B.
//!
//! The model: the layers are split over the stages as the runtime splits them
//! ([`crate::split::even_counts`]: where they do not divide, the middle stages hold one more,
//! and the busiest stage sets the pace), a pass runs at `mfu × peak`, and an
//! iteration lasts the longest rank span (post-validated optimizer steps overlap iterations)
//! or the makespan (a synchronous step), as asked. With a vocabulary,
//! the LM head's three matrix products and its activations
//! ([`flops::head_activation_bytes`]) are added to the last rank — which is what unbalances
//! real pipelines. Data parallelism multiplies the tokens per step; its gradient all-reduce is
//! taken as overlapped (not modelled).

use crate::cost::{CostSpec, RankCost};
use crate::error::Error;
use crate::flops;
use crate::generate::ScheduleKind;
pub use crate::limit::MemLimit;
use crate::planner::{PlanRequest, Planned};
use serde::Serialize;

/// The model whose training is forecast.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelShape {
    /// Layers, hidden size, attention heads, sequence length, vocabulary (0: no LM head).
    Layers {
        /// Transformer layers.
        layers: usize,
        /// Hidden size.
        hidden: usize,
        /// Attention heads.
        heads: usize,
        /// Vocabulary size (0 leaves the head out).
        vocab: usize,
    },
    /// Only a parameter count: F = I = W = 2 FLOPs per parameter and token (attention
    /// ignored, the `6·N·T` rule), and no activation sizes.
    Parameters(f64),
}

/// Everything a forecast needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastInput {
    /// The model.
    pub model: ModelShape,
    /// Sequence length (tokens).
    pub seq_len: usize,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Tokens to train on.
    pub tokens: f64,
    /// Dense peak FLOP/s of one GPU.
    pub peak_flops: f64,
    /// Fraction of the peak a pass achieves (the non-pipeline part of MFU), in (0, 1].
    pub mfu: f64,
    /// Pipeline ranks.
    pub stages: usize,
    /// Microbatches per pipeline per step.
    pub microbatches: usize,
    /// Data-parallel replicas.
    pub data_parallel: usize,
    /// Price of one GPU-hour.
    pub usd_per_gpu_hour: f64,
    /// Time of one transfer between ranks, seconds.
    pub comm_seconds: f64,
    /// Activation memory per GPU: bytes (`ModelShape::Layers` only), or a multiple of M_B.
    pub mem_limit: MemLimit,
    /// What an iteration costs.
    pub step_time: StepTime,
}

/// What one iteration of a job costs in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepTime {
    /// The longest rank span: post-validated optimizer steps (`train --post-validate`, the
    /// paper's §4) let consecutive iterations overlap, so each adds its busiest rank's span.
    Span,
    /// The makespan: a synchronous optimizer step waits for the whole iteration to drain.
    Makespan,
}

/// One schedule's forecast.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ForecastRow {
    /// Schedule name.
    pub schedule: String,
    /// Bubble of an iteration: 1 − the busiest rank's compute time / the step time (with
    /// [`StepTime::Span`] the paper's bubble rate).
    pub bubble: f64,
    /// Seconds per iteration (the simulated longest rank span or makespan, see
    /// [`StepTime`]).
    pub step_seconds: f64,
    /// Iterations to train on the tokens.
    pub steps: f64,
    /// GPU-hours of the job.
    pub gpu_hours: f64,
    /// Wall-clock days.
    pub days: f64,
    /// Price in the given currency.
    pub cost: f64,
    /// Fraction of 1F1B's cost saved (negative: dearer).
    pub saving_vs_1f1b: f64,
    /// Peak activation memory of the busiest GPU: bytes, or multiples of M_B when the
    /// model has no shape.
    pub peak_activation: f64,
    /// The memory limit the automatic schedule was planned under (multiples of M_B).
    pub planned_limit: Option<f64>,
    /// Whether it fits the memory limit (true without a limit).
    pub fits: bool,
}

/// The schedules a forecast compares, 1F1B first.
pub const SCHEDULES: [ScheduleKind; 6] = [
    ScheduleKind::OneFOneB,
    ScheduleKind::ZbH1,
    ScheduleKind::Zb1p,
    ScheduleKind::Zb2p,
    ScheduleKind::ZbV,
    ScheduleKind::ZbAuto,
];

/// Per-rank pass costs (seconds; memory in bytes or M_B units) from the FLOP model: one
/// entry per rank of a linear pipeline.
pub fn rank_costs(x: &ForecastInput) -> Result<CostSpec, Error> {
    stage_costs(x, x.stages)
}

/// Pass costs of `n` stages that split the layers as evenly as whole layers allow
/// ([`crate::split::even_counts`]), the LM head in the last one: for a
/// V placement (`n` = 2p) the head then sits on rank 0, with the last stage, as in a real
/// model — not halved over a rank's two chunks.
pub fn stage_costs(x: &ForecastInput, n: usize) -> Result<CostSpec, Error> {
    let p = n as f64;
    let (s, b) = (x.seq_len as f64, x.microbatch_size as f64);
    let speed = x.peak_flops * x.mfu;
    let stages = match x.model {
        ModelShape::Layers {
            layers,
            hidden,
            heads,
            vocab,
        } => {
            let [f, i, w] = flops::block_pass_flops(hidden, x.seq_len, x.microbatch_size);
            let (mem_b, mem_w) =
                flops::block_activation_bytes(hidden, heads, x.seq_len, x.microbatch_size, 2.0);
            let head = flops::head_pass_flops(hidden, vocab, x.seq_len, x.microbatch_size);
            let (head_b, head_w) = match vocab {
                0 => (0.0, 0.0),
                v => flops::head_activation_bytes(hidden, v, x.seq_len, x.microbatch_size, 2.0),
            };
            let counts = crate::split::even_counts(layers, n);
            (counts.iter().enumerate())
                .map(|(r, &k)| {
                    let k = k as f64;
                    let last = r + 1 == n;
                    let extra = if last { head } else { 0.0 };
                    let (hb, hw) = if last { (head_b, head_w) } else { (0.0, 0.0) };
                    RankCost {
                        f: (k * f + extra) / speed,
                        i: (k * i + extra) / speed,
                        w: (k * w + extra) / speed,
                        mem_b: k * mem_b + hb,
                        mem_w: (k * mem_w + hw).min(k * mem_b + hb),
                        b: None,
                    }
                })
                .collect()
        }
        ModelShape::Parameters(params) => {
            let t = 2.0 * params / p * s * b / speed;
            // Memory in units of a linear stage's M_B: a V stage holds half of one.
            let share = x.stages as f64 / p;
            vec![
                RankCost {
                    f: t,
                    i: t,
                    w: t,
                    mem_b: share,
                    mem_w: 0.5 * share,
                    b: None,
                };
                n
            ]
        }
    };
    Ok(CostSpec {
        comm: x.comm_seconds,
        stages,
    })
}

/// `Ok` for a finite positive `v`; otherwise an error naming the setting.
fn positive(setting: &'static str, v: f64) -> Result<(), Error> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::setting(
            setting,
            format!("must be a positive number, got {v}"),
        ))
    }
}

fn check(x: &ForecastInput) -> Result<(), Error> {
    positive("tokens", x.tokens)?;
    if x.tokens > 1e18 {
        return Err(Error::setting(
            "tokens",
            format!(
                "{:e} is beyond what this forecast models (1e18, a thousand times today's largest \
                 runs); check the unit (300B = 3e11)",
                x.tokens
            ),
        ));
    }
    positive("peak_flops", x.peak_flops)?;
    positive("usd_per_gpu_hour", x.usd_per_gpu_hour)?;
    if !(x.mfu.is_finite() && x.mfu > 0.0 && x.mfu <= 1.0) {
        return Err(Error::setting(
            "mfu",
            match x.mfu {
                // A percentage: say which fraction it means.
                p if p > 1.0 && p <= 100.0 => format!(
                    "must be a fraction of the peak in (0, 1], not a percentage: for {p}% write {}",
                    p / 100.0
                ),
                m => format!("must be a fraction of the peak in (0, 1], e.g. 0.5; got {m}"),
            },
        ));
    }
    for (setting, n) in [
        ("stages", x.stages),
        ("microbatches", x.microbatches),
        ("data_parallel", x.data_parallel),
        ("seq_len", x.seq_len),
        ("microbatch_size", x.microbatch_size),
    ] {
        if n == 0 {
            return Err(Error::setting(setting, "must be at least 1"));
        }
    }
    if x.stages > 4096 {
        return Err(Error::setting(
            "stages",
            format!("{} is beyond what this forecast models (4096)", x.stages),
        ));
    }
    if x.data_parallel > 1 << 20 {
        return Err(Error::setting(
            "data_parallel",
            format!(
                "{} is beyond what this forecast models (2^20)",
                x.data_parallel
            ),
        ));
    }
    if !(x.comm_seconds.is_finite() && x.comm_seconds >= 0.0) {
        return Err(Error::setting(
            "comm_seconds",
            format!("must be zero or positive, got {} ms", x.comm_seconds * 1e3),
        ));
    }
    check_model(x)
}

/// The model's shape: whole layers for every stage, or a parameter count with a
/// multiple-of-M_B limit.
fn check_model(x: &ForecastInput) -> Result<(), Error> {
    match x.model {
        ModelShape::Layers {
            layers,
            hidden,
            heads,
            ..
        } => {
            for (setting, n) in [("layers", layers), ("hidden", hidden), ("heads", heads)] {
                if n == 0 {
                    return Err(Error::setting(setting, "must be at least 1"));
                }
            }
            if hidden % heads != 0 {
                return Err(Error::setting(
                    "heads",
                    format!("{heads} heads do not divide the hidden size {hidden}"),
                ));
            }
            if layers < x.stages {
                return Err(Error::setting(
                    "stages",
                    format!(
                        "{layers} layers cannot fill {} pipeline stages; use fewer stages",
                        x.stages
                    ),
                ));
            }
        }
        ModelShape::Parameters(n) => {
            positive("params", n)?;
            if !x.mem_limit.budgets().is_empty() {
                return Err(Error::setting(
                    "mem_limit",
                    "in bytes needs the model's shape (layers, hidden size, heads) to size \
                     activations; with only a parameter count give a multiple of M_B (a bare \
                     number)",
                ));
            }
        }
    }
    Ok(())
}

/// A forecast: a row per schedule that applies, and why the others were left out.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Forecast {
    /// The schedules priced, 1F1B first.
    pub rows: Vec<ForecastRow>,
    /// (schedule, reason) for those that do not apply to this pipeline.
    pub omitted: Vec<(String, String)>,
}

/// The limit as a multiple of the heaviest stage's M_B (`mem_b`); at least one microbatch.
fn limit_multiple(limit: &MemLimit, mem_b: f64) -> Result<Option<f64>, Error> {
    let limit_x = match limit {
        MemLimit::None => None,
        MemLimit::Multiple(k) => Some(*k),
        MemLimit::Bytes(bytes) => Some(bytes / mem_b.max(f64::MIN_POSITIVE)),
        MemLimit::PerRank(_) => {
            return Err(Error::setting(
                "mem_limit",
                "a forecast takes one limit for every GPU, not one per rank",
            ))
        }
    };
    if let Some(l) = limit_x.filter(|l| *l < 1.0) {
        return Err(Error::setting(
            "mem_limit",
            format!(
                "holds {l:.2} microbatches' activations of a stage; a pipeline needs at least \
                 1: raise it, or shorten the sequence or the microbatch"
            ),
        ));
    }
    Ok(limit_x)
}

/// Plans every schedule of [`SCHEDULES`] that applies and prices the job under each; 1F1B,
/// the baseline of the savings, must apply.
pub fn forecast(x: &ForecastInput) -> Result<Forecast, Error> {
    check(x)?;
    let spec = rank_costs(x)?;
    let mem_b = spec.stages.iter().map(|c| c.mem_b).fold(0.0, f64::max);
    let limit_x = limit_multiple(&x.mem_limit, mem_b)?;
    let gpus = x.stages as f64 * x.data_parallel as f64;
    let tokens_per_step = x.microbatches as f64
        * x.microbatch_size as f64
        * x.seq_len as f64
        * x.data_parallel as f64;
    let steps = (x.tokens / tokens_per_step).ceil();
    let mut rows = Vec::new();
    let mut omitted = Vec::new();
    for kind in SCHEDULES {
        let spec = match kind {
            ScheduleKind::ZbV => {
                if let ModelShape::Layers { layers, .. } = x.model {
                    if layers < 2 * x.stages {
                        omitted.push((
                            kind.name().to_string(),
                            format!(
                                "a V placement needs 2 stages per rank, {} in all, and the \
                                 model has {layers} layers",
                                2 * x.stages
                            ),
                        ));
                        continue;
                    }
                }
                stage_costs(x, 2 * x.stages)?
            }
            _ => spec.clone(),
        };
        // A pattern that does not apply to this shape (e.g. ZB-V with one rank) is left out,
        // and says why.
        let req = PlanRequest {
            mem_limit: match (&x.mem_limit, limit_x) {
                // Bytes stay bytes: stages of uneven layer counts each get all of them (a
                // multiple of the heaviest stage's M_B would hold the lighter ones to less).
                (MemLimit::Bytes(b), _) => MemLimit::Bytes(*b),
                // No rank holds more than all its microbatches: a larger limit plans like m.
                (_, l) => l.map_or(MemLimit::None, |l| {
                    MemLimit::Multiple(l.min(x.microbatches as f64))
                }),
            },
            ..PlanRequest::new(kind, x.stages, x.microbatches, spec)
        };
        let Planned { schedule, sim, .. } = match crate::planner::plan(&req) {
            Ok(p) => p,
            Err(e) if kind == ScheduleKind::OneFOneB => return Err(e),
            Err(e) => {
                omitted.push((kind.name().to_string(), e.to_string()));
                continue;
            }
        };
        let peak = sim.metrics.peak_memory.iter().copied().fold(0.0, f64::max);
        let fits = limit_x.is_none_or(|l| peak <= l * mem_b * (1.0 + 1e-9));
        let step_seconds = match x.step_time {
            StepTime::Makespan => sim.metrics.makespan,
            StepTime::Span => sim.metrics.span.iter().copied().fold(0.0, f64::max),
        };
        let hours = steps * step_seconds / 3600.0;
        rows.push(ForecastRow {
            schedule: schedule.name.clone(),
            bubble: 1.0 - sim.metrics.busy.iter().copied().fold(0.0, f64::max) / step_seconds,
            step_seconds,
            steps,
            gpu_hours: hours * gpus,
            days: hours / 24.0,
            cost: hours * gpus * x.usd_per_gpu_hour,
            saving_vs_1f1b: 0.0,
            peak_activation: peak,
            planned_limit: kind.planning_limit(x.stages, limit_x),
            fits,
        });
    }
    if let Some(base) = rows.first().map(|r| r.cost) {
        for r in &mut rows {
            r.saving_vs_1f1b = 1.0 - r.cost / base;
        }
    }
    Ok(Forecast { rows, omitted })
}

/// Dense BF16 peak FLOP/s of the GPUs people price jobs in (vendor data sheets, without
/// sparsity).
pub fn gpu_peak_flops(name: &str) -> Option<f64> {
    let tflops = match name.to_ascii_lowercase().as_str() {
        "a100" => 312.0,
        "h100" => 989.0,
        "h200" => 989.0,
        "b200" => 2250.0,
        _ => return None,
    };
    Some(tflops * 1e12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_example() -> ForecastInput {
        ForecastInput {
            model: ModelShape::Layers {
                layers: 32,
                hidden: 4096,
                heads: 32,
                vocab: 0,
            },
            seq_len: 1024,
            microbatch_size: 1,
            tokens: 1e9,
            peak_flops: 312e12,
            mfu: 0.5,
            stages: 8,
            microbatches: 16,
            data_parallel: 1,
            usd_per_gpu_hour: 2.0,
            comm_seconds: 0.0,
            mem_limit: MemLimit::None,
            step_time: StepTime::Span,
        }
    }

    fn row<'a>(rows: &'a [ForecastRow], name: &str) -> &'a ForecastRow {
        rows.iter().find(|r| r.schedule == name).unwrap()
    }

    #[test]
    fn the_seed_example_one_f_one_b_closed_form_and_zb_2p_near_zero() {
        let rows = forecast(&seed_example()).unwrap().rows;
        // (p−1)/(m+p−1) = 7/23 for uniform stages without communication.
        let one = row(&rows, "1f1b");
        assert!((one.bubble - 7.0 / 23.0).abs() < 1e-9, "{}", one.bubble);
        assert!(row(&rows, "zb-2p").bubble < 0.01);
        // By hand: a stage's F+I+W = 4 layers × (72·s·h² + 12·s²·h) FLOPs.
        let (s, h) = (1024.0f64, 4096.0f64);
        let fiw = 4.0 * (72.0 * s * h * h + 12.0 * s * s * h) / (312e12 * 0.5);
        let step = 16.0 * fiw / (1.0 - 7.0 / 23.0);
        assert!((one.step_seconds / step - 1.0).abs() < 1e-9);
        let steps = (1e9f64 / (16.0 * 1024.0)).ceil();
        assert_eq!(one.steps, steps);
        let hours = steps * step / 3600.0 * 8.0;
        assert!((one.gpu_hours / hours - 1.0).abs() < 1e-9);
        assert!((one.cost - 2.0 * hours).abs() < 1e-6 * hours);
        assert_eq!(one.saving_vs_1f1b, 0.0);
        let zb = row(&rows, "zb-2p");
        assert!((zb.saving_vs_1f1b - (1.0 - zb.cost / one.cost)).abs() < 1e-12);
        // Its iterations are 16 (F+I+W) long against 1F1B's 23: 7/23 saved, minus the
        // little bubble left.
        assert!(zb.saving_vs_1f1b > 0.29, "{}", zb.saving_vs_1f1b);
        // A synchronous step also pays zb-2p's fill and drain: less saved.
        let mut x = seed_example();
        x.step_time = StepTime::Makespan;
        let rows = forecast(&x).unwrap().rows;
        assert_eq!(row(&rows, "1f1b").step_seconds, one.step_seconds);
        let sync = row(&rows, "zb-2p").saving_vs_1f1b;
        assert!(sync > 0.1 && sync < zb.saving_vs_1f1b - 0.05, "{sync}");
    }

    #[test]
    fn a_byte_limit_is_planned_and_fixed_patterns_over_it_are_flagged() {
        let mut x = seed_example();
        let mem_b = rank_costs(&x).unwrap().stages[0].mem_b;
        x.mem_limit = MemLimit::Bytes(10.0 * mem_b);
        let rows = forecast(&x).unwrap().rows;
        let auto = row(&rows, "zb-auto");
        assert_eq!(auto.planned_limit, Some(10.0));
        assert!(auto.fits && auto.peak_activation <= 10.0 * mem_b * (1.0 + 1e-9));
        assert!(!row(&rows, "zb-2p").fits);
        assert!(row(&rows, "1f1b").fits);
    }

    #[test]
    fn bad_inputs_name_the_setting() {
        let mut x = seed_example();
        x.mfu = 1.5;
        assert!(forecast(&x).unwrap_err().to_string().contains("mfu"));
        let mut x = seed_example();
        x.model = ModelShape::Parameters(1e9);
        x.mem_limit = MemLimit::Bytes(1e9);
        assert!(forecast(&x).unwrap_err().to_string().contains("mem_limit"));
        let mut x = seed_example();
        x.stages = 64;
        assert!(forecast(&x)
            .unwrap_err()
            .to_string()
            .contains("64 pipeline stages"));
    }

    #[test]
    fn the_lm_head_sits_on_the_last_stage_of_any_placement() {
        let mut x = seed_example();
        x.model = ModelShape::Layers {
            layers: 32,
            hidden: 4096,
            heads: 32,
            vocab: 50000,
        };
        let linear = stage_costs(&x, 8).unwrap();
        let v = stage_costs(&x, 16).unwrap();
        // Sixteen V stages hold half a linear stage's layers each; the head is all in the
        // last one (rank 0 under V), none in the others.
        let head = 2.0 * 1024.0 * 4096.0 * 50000.0 / (312e12 * 0.5);
        assert!((linear.stages[7].f - linear.stages[0].f - head).abs() < 1e-12);
        assert!((v.stages[15].f - v.stages[0].f - head).abs() < 1e-12);
        assert!((2.0 * v.stages[0].f - linear.stages[0].f).abs() < 1e-12);
        assert!((v.stages[14].f - v.stages[0].f).abs() < 1e-15);
        // Its activations too: the fp32 softmax over the vocabulary and the head's input.
        let tokens = 1024.0;
        let held = tokens * (2.0 * 2.0 * 4096.0 + 4.0 * 50000.0);
        assert!((linear.stages[7].mem_b - linear.stages[0].mem_b - held).abs() < 1e-3);
        let after_i = tokens * 2.0 * 4096.0;
        assert!((linear.stages[7].mem_w - linear.stages[0].mem_w - after_i).abs() < 1e-3);
        assert_eq!(v.stages[14].mem_b, v.stages[0].mem_b);
        let f = forecast(&x).unwrap();
        assert!(f.rows.iter().any(|r| r.schedule == "zb-v"));
        assert!(f.omitted.is_empty());
        // Eight layers cannot fill a V over eight ranks (16 stages): left out, with why.
        x.model = ModelShape::Layers {
            layers: 8,
            hidden: 4096,
            heads: 32,
            vocab: 0,
        };
        let f = forecast(&x).unwrap();
        assert!(!f.rows.iter().any(|r| r.schedule == "zb-v"));
        assert!(f
            .omitted
            .iter()
            .any(|(k, why)| k == "zb-v" && why.contains("16 in all")));
    }

    #[test]
    fn layers_that_do_not_divide_are_priced_at_the_busiest_stage() {
        let mut x = seed_example();
        let shape = |layers| ModelShape::Layers {
            layers,
            hidden: 4096,
            heads: 32,
            vocab: 0,
        };
        x.model = shape(9);
        let nine = rank_costs(&x).unwrap();
        x.model = shape(16);
        let sixteen = rank_costs(&x).unwrap();
        // 9 layers over 8 stages: one stage holds 2, as a real split does, not 1.125 each.
        let most = nine.stages.iter().map(|c| c.f).fold(0.0, f64::max);
        assert!((most - sixteen.stages[0].f).abs() < 1e-15);
        let total: f64 = nine.stages.iter().map(|c| c.f).sum();
        assert!((total - 4.5 * sixteen.stages[0].f).abs() < 1e-12);
        let heaviest = nine.stages.iter().map(|c| c.mem_b).fold(0.0, f64::max);
        assert_eq!(heaviest, sixteen.stages[0].mem_b);
        // The iteration is no shorter than the busiest stage's m·(F+I+W).
        let f = forecast(&x).unwrap().rows[0].step_seconds;
        x.model = shape(9);
        let g = forecast(&x).unwrap().rows[0].step_seconds;
        let c = sixteen.stages[0];
        assert!(
            g >= x.microbatches as f64 * (c.f + c.i + c.w) && g <= f,
            "{g} {f}"
        );
    }

    #[test]
    fn parameter_count_gives_equal_passes() {
        let mut x = seed_example();
        x.model = ModelShape::Parameters(8e9);
        let spec = rank_costs(&x).unwrap();
        let c = spec.stages[0];
        assert_eq!((c.f, c.i), (c.w, c.w));
        // 2 FLOPs per parameter of the stage and token.
        assert!((c.f - 2.0 * 1e9 * 1024.0 / (312e12 * 0.5)).abs() < 1e-12);
    }
}
