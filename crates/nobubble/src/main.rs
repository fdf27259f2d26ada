//! `nobubble`: plan, compare, check and benchmark pipeline-parallel schedules.
//!
//! A thin layer over the libraries: argument parsing, file I/O and printing live here, all
//! planning logic lives in `nobubble-schedule`.

mod bench;
mod check;
mod compare;
mod costs;
mod export;
mod forecast;
mod input;
mod model_source;
mod output;
mod plan;
mod progress;
mod report;
mod sample;
mod score;
mod signals;
mod train;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;

// Tensors start on a cache line (see `nobubble_nn::alloc`).
#[global_allocator]
static ALLOC: nobubble_nn::alloc::CacheLineAligned = nobubble_nn::alloc::CacheLineAligned;

#[derive(Parser)]
#[command(
    name = "nobubble",
    version,
    about = "Zero-bubble pipeline parallelism: plan, simulate, validate and compare schedules",
    long_about = "Zero-bubble pipeline parallelism: plan, simulate, validate and compare schedules.\n\n\
Start with `nobubble compare --stages 4 --microbatches 8` to see every schedule side by side, \
then `nobubble plan --schedule zb-h2 --stages 4 --microbatches 8` to look at one."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Every subcommand takes negative numbers as values (`--lr -1`), so that they reach
// nobubble's own checks and their messages instead of clap's "unexpected argument" (counts
// still meet the parser's "invalid value" for their flag).
#[derive(Subcommand)]
enum Command {
    /// Generate one schedule, simulate it and print or export it.
    #[command(after_long_help = plan::schedules_help(), allow_negative_numbers = true)]
    Plan(plan::PlanArgs),
    /// One table over every schedule that applies to a pipeline.
    #[command(allow_negative_numbers = true)]
    Compare(compare::CompareArgs),
    /// Validate and simulate a schedule file (PyTorch's compute-only CSV).
    #[command(allow_negative_numbers = true)]
    Check(check::CheckArgs),
    /// Train a GPT on text under any schedule: ranks as threads, or as processes under mpirun.
    #[command(allow_negative_numbers = true)]
    Train(Box<train::TrainArgs>),
    /// What a training job costs (GPU-hours, days, dollars) under each schedule, from the
    /// FLOP model.
    #[command(allow_negative_numbers = true)]
    Forecast(forecast::ForecastArgs),
    /// Continue a prompt with a model saved by `train --save`.
    #[command(allow_negative_numbers = true)]
    Sample(sample::SampleArgs),
    /// Loss, perplexity and logits of a text under a checkpoint or a Hugging Face model.
    #[command(allow_negative_numbers = true)]
    Score(score::ScoreArgs),
    /// Write a checkpoint in Hugging Face's format (transformers loads the directory).
    #[command(allow_negative_numbers = true)]
    Export(export::ExportArgs),
    /// Benchmarks: the paper's table, simulator and planner speed, memory sweep, engine speed.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so printing into a closed pipe (`nobubble compare … | head`)
    // would panic; restore the default: the process just ends, as other CLI tools do.
    #[cfg(unix)]
    // SAFETY: called first thing, before any thread exists; only resets a signal disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    output::install_stdout_failure_hook();
    let cli = Cli::parse();
    // A bad NOBUBBLE_SIMD is an error up front, not a silent fallback to another level (for
    // the commands that run kernels: planning does not care).
    let computes = matches!(
        cli.command,
        Command::Train(_) | Command::Sample(_) | Command::Score(_) | Command::Bench(_)
    );
    if let (true, Err(e)) = (computes, nobubble_nn::Simd::from_env()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Command::Plan(a) => plan::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Check(a) => check::run(a),
        Command::Train(a) => match train::run(a) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Forecast(a) => forecast::run(a),
        Command::Sample(a) => sample::run(a),
        Command::Score(a) => score::run(a),
        Command::Export(a) => export::run(a),
        Command::Bench(b) => bench::run(b),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            // Not `eprintln!`: with standard error closed that would panic.
            let _ = writeln!(std::io::stderr(), "error: {msg}");
            ExitCode::FAILURE
        }
    }
}
