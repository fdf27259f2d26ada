//! What rank 0 shows while `train` runs: a progress bar (a terminal) or a line every ten
//! steps (a log file), the JSON lines of `--log`, the Chrome trace of `--trace`, and the
//! Prometheus metrics of `--metrics-addr`. One [`StepRates`] per step feeds all of them, so
//! they agree.

use crate::output::tell;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nobubble_runtime::metrics::{Metrics, StepRates};
use nobubble_runtime::training::{mib, Observer};
use nobubble_runtime::{Plan, StepRecord};
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Rank 0's view of the run.
pub struct Watch {
    steps: u64,
    tokens_per_step: f64,
    /// Model FLOPs of one step (all replicas), MFU's numerator.
    pub flops_per_step: f64,
    /// Peak FLOP/s of all ranks; `None` for emulated compute (no model FLOPs run).
    pub peak_flops: Option<f64>,
    tty: bool,
    log: Option<std::io::BufWriter<std::fs::File>>,
    /// `--trace`, streamed step by step.
    pub trace: Option<super::trace::TraceFile>,
    trace_offset: f64,
    metrics: Option<Metrics>,
    bar: Option<ProgressBar>,
    validation_bar: Option<ProgressBar>,
    stop: Option<Arc<AtomicUsize>>,
    stop_noticed: bool,
    /// Dropped when the first plan is in use: ends the set-up's progress line.
    pub setup_done: Option<std::sync::mpsc::Sender<()>>,
    /// Emulated compute: no loss, no activations.
    emulated: bool,
}

/// What the watcher needs to know about the job.
pub struct WatchOptions<'a> {
    /// Total steps of the job and the step it starts at.
    pub steps: u64,
    /// Tokens of one step (all replicas).
    pub tokens_per_step: f64,
    /// Model FLOPs of one step (all replicas).
    pub flops_per_step: f64,
    /// Peak FLOP/s of all ranks (`None`: emulated compute).
    pub peak_flops: Option<f64>,
    /// `--log` file.
    pub log: Option<&'a Path>,
    /// Append to the `--log` file instead of starting it anew (a resumed run continues the
    /// log of the run it resumes; a fresh one replaces it).
    pub append_log: bool,
    /// `--trace`'s path.
    pub trace: Option<&'a Path>,
    /// Emulated compute (no loss or activations to show).
    pub emulated: bool,
    /// Metrics to update (`--metrics-addr`).
    pub metrics: Option<Metrics>,
    /// The stop request the signal handlers set.
    pub stop: Option<Arc<AtomicUsize>>,
}

impl Watch {
    /// A watcher; creates the `--log` file.
    pub fn new(o: WatchOptions) -> Result<Watch, String> {
        let tty = std::io::stderr().is_terminal();
        Ok(Watch {
            steps: o.steps,
            tokens_per_step: o.tokens_per_step,
            flops_per_step: o.flops_per_step,
            peak_flops: o.peak_flops,
            tty,
            log: match o.log {
                Some(p) => Some(std::io::BufWriter::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .append(o.append_log)
                        .truncate(!o.append_log)
                        .open(p)
                        .map_err(|e| format!("cannot create --log {}: {e}", p.display()))?,
                )),
                None => None,
            },
            trace: o.trace.map(super::trace::TraceFile::create).transpose()?,
            trace_offset: 0.0,
            metrics: o.metrics,
            bar: None,
            validation_bar: None,
            stop: o.stop,
            stop_noticed: false,
            setup_done: None,
            emulated: o.emulated,
        })
    }

    /// Prints a line without tearing the progress bar.
    fn say(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => tell!("{text}"),
        }
    }

    /// Flushes `--log` and takes the progress bar off the screen.
    pub fn finish(&mut self) -> Result<(), String> {
        if let Some(bar) = self.bar.take() {
            bar.finish();
            // The finished bar stays; what follows starts on a line of its own.
            tell!();
        }
        if let Some(w) = self.log.as_mut() {
            w.flush().map_err(|e| format!("cannot write --log: {e}"))?;
        }
        Ok(())
    }

    fn notice_stop(&mut self) {
        let sig = self.stop.as_ref().map_or(0, |s| s.load(Ordering::SeqCst));
        if sig != 0 && !self.stop_noticed {
            self.stop_noticed = true;
            let name = if sig == 15 { "SIGTERM" } else { "SIGINT" };
            self.say(&format!(
                "{name} received: finishing the current step, then the log, trace, checkpoint \
                 (with --save) and report; send it again to quit at once"
            ));
        }
    }

    fn bar(&mut self, first: u64) -> &ProgressBar {
        let (steps, tty) = (self.steps, self.tty);
        self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
            if !tty {
                bar.set_draw_target(ProgressDrawTarget::hidden());
            }
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:20}] {pos}/{len} ETA {eta} {wide_msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_position(first);
            bar.reset_eta();
            bar
        })
    }
}

impl Observer for Watch {
    fn note(&mut self, text: &str) {
        self.say(text);
    }

    fn planned(&mut self, plan: &Plan) {
        self.setup_done = None;
        if let Some(m) = &self.metrics {
            m.set_planned_bubble(plan.simulated_bubble_fraction);
        }
    }

    fn progress(&mut self, phase: &str, done: u64, total: u64) {
        self.notice_stop();
        if !self.tty {
            return;
        }
        // The training bar, if any, is done: leave it on screen, finished, above this one.
        if let Some(bar) = self.bar.take() {
            bar.finish();
            // The finished bar stays; what follows starts on a line of its own.
            tell!();
        }
        let bar = self.validation_bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} {msg} [{bar:28}] {pos}/{len}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(phase.to_string());
            bar
        });
        bar.set_position(done);
        if done >= total {
            bar.finish_and_clear();
            self.validation_bar = None;
        }
    }

    fn step(&mut self, rec: &StepRecord, schedule: &str) -> Result<(), String> {
        let rates = StepRates::of(
            rec,
            self.tokens_per_step,
            self.flops_per_step,
            self.peak_flops.unwrap_or(f64::NAN),
        );
        let mfu = self.peak_flops.map(|_| rates.mfu);
        // Emulated passes compute nothing: no loss, gradient norm or MFU (the sums of nothing
        // are a −0 that would pass for a value). NaN is Prometheus' "no value", as the log's
        // null.
        let rates = if self.emulated {
            StepRates {
                loss: f64::NAN,
                grad_norm: f64::NAN,
                ..rates
            }
        } else {
            rates
        };
        let (loss, grad_norm) = (!self.emulated)
            .then_some((rec.loss, rec.grad_norm))
            .unzip();
        if let Some(m) = &self.metrics {
            m.record_step(
                rec,
                &StepRates {
                    mfu: mfu.unwrap_or(f64::NAN),
                    ..rates
                },
            );
        }
        let tps = rates.tokens_per_second;
        let peak = rec.peak_bytes.iter().copied().max().unwrap_or(0);
        if let Some(w) = self.log.as_mut() {
            let line = json!({"step": rec.step + 1, "loss": loss, "grad_norm": grad_norm, "lr": rec.lr,
                "skipped": rec.skipped, "clip_scale": rec.clip_scale, "tokens_per_s": tps, "step_seconds": rec.wall,
                "span_seconds": rec.makespan, "bubble_fraction": rec.bubble_fraction, "mfu": mfu,
                "peak_activation_bytes": rec.peak_bytes, "schedule": schedule,
                "sent_bytes": rec.comm.iter().map(|c| c.sent_bytes).collect::<Vec<_>>(),
                "wait_seconds": rec.comm.iter().map(|c| c.wait_seconds).collect::<Vec<_>>(),
                "reduce_seconds": rec.comm.iter().map(|c| c.reduce_seconds).collect::<Vec<_>>(),
                "borrowed_products": rec.comm.iter().map(|c| c.borrowed_products).collect::<Vec<_>>()});
            // One write per line: an interrupted run never leaves half a line behind.
            let mut text = line.to_string();
            text.push('\n');
            if let Err(e) = w.write_all(text.as_bytes()).and_then(|_| w.flush()) {
                // A closed `--log /dev/stdout | head` or a full disk: the training is still
                // worth keeping, so stop cleanly after this step (saved, as on Ctrl-C).
                self.log = None;
                tell!("error: cannot write --log: {e}; stopping after this step");
                crate::output::stop_for_output("--log", &e);
            }
        }
        if let Some(trace) = self.trace.as_mut() {
            for (rank, slots) in rec.timeline.iter().enumerate() {
                for s in slots {
                    trace.event(&json!({"name": format!("{}{}", s.action.kind.letter(), s.action.microbatch),
                        "cat": s.action.kind.letter().to_string(), "ph": "X", "pid": rank, "tid": s.action.stage,
                        "ts": (self.trace_offset + s.start) * 1e6, "dur": (s.end - s.start) * 1e6,
                        "args": {"step": rec.step + 1, "waited_ms": s.waited * 1e3}}))?;
                }
            }
            self.trace_offset += rec.wall.max(rec.makespan);
        }
        let step = rec.step;
        if self.tty {
            // Short enough for an 80-column terminal.
            let mfu_text = mfu.map_or(String::new(), |x| format!(" · MFU {:.0}%", 100.0 * x));
            let loss_text = loss.map_or(String::new(), |l| format!("loss {l:.3} · "));
            let summary = format!(
                "{loss_text}{:.0} tok/s · bubble {:.1}%{mfu_text}",
                tps,
                100.0 * rec.bubble_fraction,
            );
            let bar = self.bar(step);
            bar.set_position(step + 1);
            bar.set_message(summary);
        } else if step.is_multiple_of(10) || step + 1 == self.steps {
            let mfu_text = mfu.map_or(String::new(), |x| format!("  MFU {:.1}%", 100.0 * x));
            let loss_text = loss.map_or(String::new(), |l| format!("loss {l:.4}  "));
            let peak_text = match self.emulated {
                true => String::new(),
                false => format!("  peak act {}", mib(peak as f64)),
            };
            tell!(
                "step {:>4}/{}  {loss_text}{:>6.0} tok/s  bubble {:>5.1}%{mfu_text}{peak_text}",
                step + 1,
                self.steps,
                tps,
                100.0 * rec.bubble_fraction,
            );
        }
        self.notice_stop();
        Ok(())
    }
}
