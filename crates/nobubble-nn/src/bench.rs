//! Speed of one transformer block's F, I and W passes, next to the `gemm` crate's own
//! speed on the block's dominant matrix shape and the core's FMA peak, with where each
//! pass's time goes.
//!
//! Why: the planner needs measured T_F, T_I, T_W, and the engine is only worth its
//! split if each pass runs close to raw gemm speed. FLOPs are counted as in the
//! paper (REFERENCE §1): F = s·b·h·(24h + 4s), I = s·b·h·(24h + 8s), W = 24·s·b·h² for a
//! GPT block; a Llama block's matrix products are counted the same way
//! (`flops::BlockShape`).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{on_backend, Backend, CpuBackend};
use crate::config::{Arch, GptConfig};
use crate::error::MicrobatchId;
use crate::error::{NnError, Result};
use crate::layers::{Block, SplitLayer};
use crate::model::{Stage, StageInput};
use crate::param::SplitMix64;
use crate::profiler::TimingBackend;
use crate::simd::Simd;
use crate::tensor::Tensor;

/// Shape of the benchmarked block and how often to repeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineBenchConfig {
    /// Block family (Llama blocks: half as many K/V heads, SwiGLU of width 8h/3).
    pub arch: Arch,
    /// Hidden size h.
    pub hidden: usize,
    /// Attention heads a.
    pub heads: usize,
    /// Sequence length s.
    pub seq_len: usize,
    /// Sequences per microbatch b.
    pub microbatch_size: usize,
    /// Timed repetitions (the median is reported).
    pub repeats: usize,
    /// Untimed warm-up repetitions.
    pub warmup: usize,
    /// Threads per operation (a pipeline rank's `--threads-per-rank`).
    pub threads: usize,
    /// SIMD level; `None`: [`Simd::selected`].
    pub simd: Option<Simd>,
}

impl Default for EngineBenchConfig {
    fn default() -> Self {
        EngineBenchConfig {
            arch: Arch::Gpt,
            hidden: 512,
            heads: 8,
            seq_len: 256,
            microbatch_size: 4,
            repeats: 7,
            warmup: 1,
            threads: 1,
            simd: None,
        }
    }
}

/// Median per-pass times and throughputs of one block on one thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineBenchReport {
    /// Block family.
    pub arch: Arch,
    /// Hidden size h.
    pub hidden: usize,
    /// Attention heads a.
    pub heads: usize,
    /// Sequence length s.
    pub seq_len: usize,
    /// Sequences per microbatch b.
    pub microbatch_size: usize,
    /// Timed repetitions.
    pub repeats: usize,
    /// Threads per operation.
    pub threads: usize,
    /// SIMD level of every kernel (`avx512`, `avx2`, `portable`).
    pub simd: String,
    /// The FMA peak of the cores used at that level (measured: [`Simd::fma_peak_flops`]
    /// × threads), GFLOP/s.
    pub fma_peak_gflops: f64,
    /// Median F time, ms.
    pub f_ms: f64,
    /// Median I time, ms.
    pub i_ms: f64,
    /// Median W time, ms.
    pub w_ms: f64,
    /// F GFLOP/s (paper FLOP count).
    pub f_gflops: f64,
    /// I GFLOP/s.
    pub i_gflops: f64,
    /// W GFLOP/s.
    pub w_gflops: f64,
    /// gemm's own GFLOP/s on `(s·b)×h · h×4h`, same threads and level.
    pub gemm_gflops: f64,
    /// F, I, W: the FLOPs the kernels execute over the paper's count. The paper counts the
    /// whole `s × s` attention square; the causal kernels skip the blocks above the
    /// diagonal, so F and I execute fewer (W has no attention: 1).
    pub executed_share: [f64; 3],
    /// Where each pass's time goes (F, I, W): mean ms per backend operation kind
    /// (`matmul`, `layernorm`, `gelu`, `softmax`, …) and `other` (the pass time outside
    /// the backend: copies, allocation, bookkeeping).
    pub profile: [BTreeMap<String, f64>; 3],
    /// F, I, W times relative to F (measured T_F : T_I : T_W).
    pub time_ratio: [f64; 3],
    /// F, I, W FLOPs relative to F (the paper's Table 1 ratio for this shape).
    pub flop_ratio: [f64; 3],
    /// Activation bytes the block holds from F until I (measured M_B).
    pub bytes_after_forward: usize,
    /// Activation bytes the block holds from I until W (measured M_W).
    pub bytes_after_input_grad: usize,
}

/// Paper FLOP counts (F, I, W) of one block: the planner's model.
pub use nobubble_schedule::flops::block_pass_flops as block_flops;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn random(shape: &[usize], seed: u64) -> Tensor {
    let mut r = SplitMix64::new(seed);
    let n = shape.iter().product();
    Tensor::from_vec(shape, (0..n).map(|_| r.next_normal() as f32).collect())
        .expect("shape and data agree")
}

/// The one-block model the benchmark runs, after checking the shape.
fn block_model(cfg: &EngineBenchConfig) -> Result<GptConfig> {
    let (h, a, s, b) = (cfg.hidden, cfg.heads, cfg.seq_len, cfg.microbatch_size);
    if h == 0 || a == 0 || s == 0 || b == 0 || cfg.repeats == 0 || cfg.threads == 0 {
        return Err(NnError::Config(
            "hidden, heads, seq_len, microbatch_size, repeats and threads must be positive".into(),
        ));
    }
    if h % a != 0 {
        return Err(NnError::Config(format!(
            "hidden {h} is not divisible by {a} heads"
        )));
    }
    let model = GptConfig {
        layers: 1,
        hidden: h,
        heads: a,
        seq_len: s,
        microbatch_size: b,
        ..GptConfig::micro()
    }
    .with_arch(cfg.arch);
    model.validate()?;
    model.check_size()?;
    Ok(model)
}

/// Runs the benchmark.
pub fn engine_bench(cfg: &EngineBenchConfig) -> Result<EngineBenchReport> {
    let model = block_model(cfg)?;
    let (h, a, s, b) = (cfg.hidden, cfg.heads, cfg.seq_len, cfg.microbatch_size);
    let cpu =
        CpuBackend::with_threads(cfg.threads).with_simd(cfg.simd.unwrap_or(Simd::selected()))?;
    let be = TimingBackend::new(&cpu);
    let n = s * b;
    let mut block = Block::new(0, &model, 7);
    let x = random(&[n, h], 1);
    let dy = random(&[n, h], 2);
    let lhs = random(&[n, h], 3);
    let rhs = random(&[h, 4 * h], 4);
    let mut out = Tensor::zeros(&[n, 4 * h]);
    let (mut tf, mut ti, mut tw, mut tg) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut profile: [BTreeMap<String, f64>; 3] = Default::default();
    let (mut after_f, mut after_i) = (0, 0);
    // The gemm baseline is timed inside the same repetitions, so both see the same
    // machine load.
    for rep in 0..cfg.warmup + cfg.repeats {
        let xin = x.clone();
        let t0 = Instant::now();
        // Through `install`, as a stage runs its passes: on the backend's own threads.
        let y = on_backend(&be, || block.forward(&be, 0, xin))?;
        let t1 = Instant::now();
        let ops_f = be.take();
        after_f = block.held_bytes(0);
        drop(y);
        let g = dy.clone();
        let t2 = Instant::now();
        let dx = on_backend(&be, || block.backward_input(&be, 0, g))?;
        let t3 = Instant::now();
        let ops_i = be.take();
        after_i = block.held_bytes(0);
        drop(dx);
        let t4 = Instant::now();
        on_backend(&be, || block.backward_weight(&be, 0))?;
        let t5 = Instant::now();
        let ops_w = be.take();
        on_backend(&cpu, || {
            cpu.matmul(out.mat_mut(), lhs.mat(), rhs.mat(), 1.0, false)
        });
        let t6 = Instant::now();
        if rep >= cfg.warmup {
            tf.push((t1 - t0).as_secs_f64());
            ti.push((t3 - t2).as_secs_f64());
            tw.push((t5 - t4).as_secs_f64());
            tg.push((t6 - t5).as_secs_f64());
            let passes = [(ops_f, t1 - t0), (ops_i, t3 - t2), (ops_w, t5 - t4)];
            for (into, (ops, total)) in profile.iter_mut().zip(passes) {
                add_to_profile(into, ops, total.as_secs_f64(), cfg.repeats);
            }
        }
    }
    let (f, i, w) = (median(tf), median(ti), median(tw));
    let flops = model.block_shape().pass_flops();
    let executed_share = executed_share(&model, flops);
    let gemm_gflops = 2.0 * (n * h * 4 * h) as f64 / median(tg) / 1e9;
    let peak = cpu.simd().fma_peak_flops(0.05) * cfg.threads as f64;
    Ok(EngineBenchReport {
        arch: cfg.arch,
        hidden: h,
        heads: a,
        seq_len: s,
        microbatch_size: b,
        repeats: cfg.repeats,
        threads: cfg.threads,
        simd: cpu.simd().to_string(),
        fma_peak_gflops: peak / 1e9,
        f_ms: f * 1e3,
        i_ms: i * 1e3,
        w_ms: w * 1e3,
        f_gflops: flops[0] / f / 1e9,
        i_gflops: flops[1] / i / 1e9,
        w_gflops: flops[2] / w / 1e9,
        gemm_gflops,
        executed_share,
        profile,
        time_ratio: [1.0, i / f, w / f],
        flop_ratio: [1.0, flops[1] / flops[0], flops[2] / flops[0]],
        bytes_after_forward: after_f,
        bytes_after_input_grad: after_i,
    })
}

/// F, I, W's executed FLOPs over the paper's `flops`: of attention's products, counted over
/// the whole square, the causal blocks compute
/// [`crate::layers::attention::causal_work_fraction`].
fn executed_share(model: &GptConfig, flops: [f64; 3]) -> [f64; 3] {
    let skipped = 1.0 - crate::layers::attention::causal_work_fraction(model.seq_len);
    let attention = model.block_shape().attention_pass_flops();
    std::array::from_fn(|k| (flops[k] - skipped * attention[k]) / flops[k])
}

/// Adds one pass's operation times (and the rest of its `total` seconds, as `other`) to
/// `profile`, in ms averaged over `repeats`.
fn add_to_profile(
    profile: &mut BTreeMap<String, f64>,
    ops: BTreeMap<&'static str, f64>,
    total: f64,
    repeats: usize,
) {
    let other = (total - ops.values().sum::<f64>()).max(0.0);
    for (kind, sec) in ops.into_iter().chain([("other", other)]) {
        *profile.entry(kind.to_string()).or_default() += sec * 1e3 / repeats as f64;
    }
}

/// The FLOP/s one thread reaches on a square 256×256 GEMM, the best of repeated runs for
/// about `seconds`: the peak that MFU figures on this machine are measured against.
pub fn gemm_peak_flops(seconds: f64) -> f64 {
    let n = 256;
    let be = CpuBackend::single_thread();
    let a = random(&[n, n], 11);
    let b = random(&[n, n], 12);
    let mut out = Tensor::zeros(&[n, n]);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    for rep in 0.. {
        let t0 = Instant::now();
        be.matmul(out.mat_mut(), a.mat(), b.mat(), 1.0, false);
        best = best.min(t0.elapsed().as_secs_f64());
        if rep >= 3 && start.elapsed().as_secs_f64() >= seconds {
            break;
        }
    }
    2.0 * (n * n * n) as f64 / best.max(1e-12)
}

/// Measured per-stage costs for the planner: median F, I, W times of one microbatch
/// on this stage's backend, and the activation bytes held after F (M_B) and after I
/// (M_W).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageProfile {
    /// Stage index.
    pub stage: usize,
    /// Median F time, ms.
    pub f_ms: f64,
    /// Median I time, ms.
    pub i_ms: f64,
    /// Median W time, ms.
    pub w_ms: f64,
    /// Bytes held from F until I (M_B).
    pub bytes_after_forward: usize,
    /// Bytes held from I until W (M_W).
    pub bytes_after_input_grad: usize,
}

/// Times `repeats` F→I→W cycles of one microbatch (`config.microbatch_size` sequences
/// of random data) on `stage` under a reserved microbatch id, after one warm-up
/// cycle. Gradient accumulators are restored afterwards, so profiling mid-training is
/// safe. This is how the planner's T_F, T_I, T_W become measurements.
pub fn profile_stage(stage: &mut Stage, repeats: usize) -> Result<StageProfile> {
    const PROBE: MicrobatchId = MicrobatchId::MAX - 1;
    if repeats == 0 {
        return Err(NnError::Config("repeats must be positive".into()));
    }
    let cfg = stage.config().clone();
    let n = cfg.tokens_per_microbatch();
    let mut rng = SplitMix64::new(11);
    let tokens: Vec<u32> = (0..n)
        .map(|_| rng.next_below(cfg.vocab as u64) as u32)
        .collect();
    let act = random(&[n, cfg.hidden], 12);
    let grad = random(&[n, cfg.hidden], 13);
    let saved: Vec<Tensor> = stage.params().iter().map(|p| p.grad.clone()).collect();
    let tree = stage.grad_tree.take();
    let (mut tf, mut ti, mut tw) = (Vec::new(), Vec::new(), Vec::new());
    let (mut after_f, mut after_i) = (0, 0);
    for rep in 0..=repeats {
        let input = if stage.is_first() {
            StageInput::Tokens(&tokens)
        } else {
            StageInput::Activations(act.clone())
        };
        let g = (!stage.is_last()).then(|| grad.clone());
        let t0 = Instant::now();
        let out = stage.forward(PROBE, input, Some(&tokens))?;
        let t1 = Instant::now();
        drop(out);
        after_f = stage.held_bytes(PROBE);
        let t2 = Instant::now();
        let dx = stage.backward_input(PROBE, g)?;
        let t3 = Instant::now();
        drop(dx);
        after_i = stage.held_bytes(PROBE);
        let t4 = Instant::now();
        stage.backward_weight(PROBE)?;
        let t5 = Instant::now();
        if rep > 0 {
            tf.push((t1 - t0).as_secs_f64() * 1e3);
            ti.push((t3 - t2).as_secs_f64() * 1e3);
            tw.push((t5 - t4).as_secs_f64() * 1e3);
        }
    }
    for (p, g) in stage.params_mut().into_iter().zip(saved) {
        p.grad = g;
    }
    stage.grad_tree = tree;
    Ok(StageProfile {
        stage: stage.index(),
        f_ms: median(tf),
        i_ms: median(ti),
        w_ms: median(tw),
        bytes_after_forward: after_f,
        bytes_after_input_grad: after_i,
    })
}

impl EngineBenchReport {
    /// Human-readable table.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{} block h={} heads={} s={} b={} ({} thread{}, {} kernels, median of {})\n",
            self.arch.name(),
            self.hidden,
            self.heads,
            self.seq_len,
            self.microbatch_size,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.simd,
            self.repeats
        );
        out += "pass      ms   GFLOP/s  % of gemm  % of FMA peak  time ratio  FLOP ratio  % of gemm (executed FLOPs)\n";
        let rows = [
            ("F", self.f_ms, self.f_gflops, 0),
            ("I", self.i_ms, self.i_gflops, 1),
            ("W", self.w_ms, self.w_gflops, 2),
        ];
        for (name, ms, gf, k) in rows {
            out += &format!(
                "{name:<4} {ms:>7.2} {gf:>9.2} {:>9.1}% {:>13.1}% {:>11.2} {:>11.2} {:>27.1}%\n",
                100.0 * gf / self.gemm_gflops,
                100.0 * gf / self.fma_peak_gflops,
                self.time_ratio[k],
                self.flop_ratio[k],
                100.0 * gf * self.executed_share[k] / self.gemm_gflops
            );
        }
        out += &format!(
            "gemm ({}x{} · {}x{}): {:.2} GFLOP/s = {:.1}% of the FMA peak ({:.2} GFLOP/s, {})\n",
            self.seq_len * self.microbatch_size,
            self.hidden,
            self.hidden,
            4 * self.hidden,
            self.gemm_gflops,
            100.0 * self.gemm_gflops / self.fma_peak_gflops,
            self.fma_peak_gflops,
            self.simd,
        );
        out += "(% of gemm counts the paper's FLOPs, attention's whole s × s square; executed \
                FLOPs leave out the blocks above the diagonal that the causal kernels skip)\n";
        out += "where the time goes (ms per pass; other = copies, allocation, bookkeeping):\n";
        let mut kinds: Vec<&String> = self.profile.iter().flat_map(|p| p.keys()).collect();
        kinds.sort();
        kinds.dedup();
        kinds.sort_by_key(|k| (!k.starts_with("matmul"), k.as_str() == "other"));
        out += &format!("{:<20}{:>9}{:>9}{:>9}\n", "", "F", "I", "W");
        for kind in kinds {
            out += &format!("{kind:<20}");
            for p in &self.profile {
                out += &format!("{:>9.2}", p.get(kind).copied().unwrap_or(0.0));
            }
            out += "\n";
        }
        out += &format!(
            "activation memory per microbatch: M_B = {} bytes (after F), M_W = {} bytes (after I)\n",
            self.bytes_after_forward, self.bytes_after_input_grad
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executed_flops_leave_out_the_blocks_above_the_diagonal() {
        use crate::layers::attention::causal_work_fraction;
        // Row blocks of 16 against the columns up to their end: k(k+1)/2 of k² tiles.
        assert_eq!(causal_work_fraction(128), 9.0 / 16.0);
        assert_eq!(causal_work_fraction(16), 1.0);
        assert_eq!(causal_work_fraction(20), (16.0 * 16.0 + 4.0 * 20.0) / 400.0);
        // h 256, s 128: per token 24h² in the products, 4sh (F) and 8sh (I) of attention.
        let model = GptConfig {
            hidden: 256,
            heads: 4,
            seq_len: 128,
            microbatch_size: 8,
            ..GptConfig::tiny()
        };
        let flops = model.block_shape().pass_flops();
        let share = executed_share(&model, flops);
        let (products, sh) = (24.0 * 256.0 * 256.0, 128.0 * 256.0);
        let f = (products + 4.0 * sh * 9.0 / 16.0) / (products + 4.0 * sh);
        let i = (products + 8.0 * sh * 9.0 / 16.0) / (products + 8.0 * sh);
        assert!(
            (share[0] - f).abs() < 1e-12 && (share[1] - i).abs() < 1e-12,
            "{share:?}"
        );
        assert_eq!(share[2], 1.0);
    }

    #[test]
    fn flop_counts_follow_the_paper_and_bad_configs_are_errors() {
        let [f, i, w] = block_flops(512, 256, 1);
        assert_eq!(f, 256.0 * 512.0 * (24.0 * 512.0 + 1024.0));
        assert!((i + w - 2.0 * f).abs() / f < 0.2, "I + W ≈ 2F");
        assert!(w < f && f < i);
        let bad = EngineBenchConfig {
            heads: 3,
            ..EngineBenchConfig::default()
        };
        assert!(engine_bench(&bad).is_err());
        let tiny = EngineBenchConfig {
            hidden: 16,
            heads: 2,
            seq_len: 16,
            microbatch_size: 2,
            repeats: 1,
            warmup: 0,
            ..EngineBenchConfig::default()
        };
        let r = engine_bench(&tiny).unwrap();
        assert!(r.f_ms > 0.0 && r.bytes_after_forward > r.bytes_after_input_grad);
        // The profile splits each pass's time: its parts add up to the pass (±rounding),
        // and every pass multiplies matrices.
        for (k, total) in [r.f_ms, r.i_ms, r.w_ms].into_iter().enumerate() {
            let parts: f64 = r.profile[k].values().sum();
            assert!(r.profile[k]["matmul"] > 0.0);
            assert!(
                (parts - total).abs() <= 0.05 * total + 1e-3,
                "{parts} vs {total}"
            );
        }
        assert!(r.to_table().contains("layernorm") && r.fma_peak_gflops > 0.0);
        let json = serde_json::to_value(&r).unwrap();
        let cfg = crate::GptConfig::micro();
        let mut stages = crate::build_stages(&cfg, 1, &[1, 1]).unwrap();
        for s in &mut stages {
            let p = profile_stage(s, 2).unwrap();
            let m = s.measure_memory().unwrap().total;
            assert_eq!(
                (p.bytes_after_forward, p.bytes_after_input_grad),
                (m.after_forward, m.after_input_grad)
            );
            assert!(p.f_ms > 0.0 && p.i_ms > 0.0 && p.w_ms > 0.0);
            assert!(s
                .params()
                .iter()
                .all(|p| p.grad.data().iter().all(|&g| g == 0.0)));
        }
        for key in [
            "f_ms",
            "i_ms",
            "w_ms",
            "f_gflops",
            "i_gflops",
            "w_gflops",
            "gemm_gflops",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }
}
