//! `nobubble bench engine`: speed of one transformer block's F, I and W passes (the
//! split-backward engine of `nobubble-nn`), beside the `gemm` crate's own speed on the
//! block's dominant matrix shape and the core's FMA peak, and where each pass's time goes.

use nobubble_nn::bench::{engine_bench, EngineBenchConfig};
use nobubble_nn::config::Arch;
use nobubble_nn::Simd;

/// Arguments of `bench engine`.
#[derive(clap::Args, Debug)]
pub struct EngineBenchArgs {
    /// Block family: gpt, or llama (RMSNorm, rotary positions, SwiGLU of width 8h/3 rounded
    /// up to 32, half as many K/V heads).
    #[arg(long, default_value = "gpt", value_parser = ["gpt", "llama"])]
    pub arch: String,
    /// Hidden size h.
    #[arg(long, default_value_t = 512)]
    pub hidden: usize,
    /// Attention heads (must divide the hidden size).
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Sequence length s.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Sequences per microbatch b.
    #[arg(long, default_value_t = 4)]
    pub microbatch_size: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub repeat: usize,
    /// Threads per operation (what `train --threads-per-rank` gives each rank).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// SIMD level of the kernels: auto, avx512, avx2 or portable [default: $NOBUBBLE_SIMD,
    /// else auto]
    #[arg(long)]
    pub simd: Option<String>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark and prints a table or JSON.
pub fn run(args: &EngineBenchArgs) -> Result<(), String> {
    nobubble_runtime::machine::check_threads("--threads", args.threads)?;
    let cfg = EngineBenchConfig {
        arch: Arch::parse(&args.arch).map_err(|e| e.to_string())?,
        hidden: args.hidden,
        heads: args.heads,
        seq_len: args.seq_len,
        microbatch_size: args.microbatch_size,
        repeats: args.repeat,
        threads: args.threads,
        simd: args
            .simd
            .as_deref()
            .map(Simd::parse)
            .transpose()
            .map_err(|e| format!("--simd: {e}"))?,
        ..EngineBenchConfig::default()
    };
    let report = engine_bench(&cfg).map_err(|e| e.to_string())?;
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}
