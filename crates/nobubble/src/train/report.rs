//! The end of `train` on rank 0: the text report on stdout, and the files asked for —
//! `--trace` (Chrome), `--report` (JSON), `--timeline-svg` (measured above planned).

use crate::output::{say, tell};
use crate::train::watch::Watch;
use crate::train::TrainArgs;
use nobubble_runtime::training::{mib, Stop, TrainJob, TrainReport};
use nobubble_runtime::StepRecord;
use nobubble_schedule::export::svg;
use nobubble_schedule::sim::Slot;
use serde_json::{json, Value};

/// Means over the steps the report covers (the final plan's, warm-up left out).
struct Summary {
    span_s: f64,
    bubble: f64,
    bubble_rate: f64,
    mfu: Option<f64>,
}

fn summary(r: &TrainReport, watch: &Watch) -> Summary {
    let tail = &r.tail;
    let mean =
        |f: &dyn Fn(&StepRecord) -> f64| tail.iter().map(f).sum::<f64>() / tail.len().max(1) as f64;
    let flops = watch.flops_per_step;
    Summary {
        span_s: mean(&|r| r.makespan),
        bubble: mean(&|r| r.bubble_fraction),
        bubble_rate: mean(&|r| r.bubble_rate),
        mfu: watch
            .peak_flops
            .map(|peak| flops / r.wall_per_step.max(f64::MIN_POSITIVE) / peak),
    }
}

/// Prints the report and writes the files; returns the exit status: 0, or 128 + the signal
/// that stopped the run. A run stopped by non-finite losses is an error.
pub fn finish(
    a: &TrainArgs,
    job: &TrainJob,
    r: &TrainReport,
    mut watch: Watch,
) -> Result<u8, String> {
    watch.finish()?;
    // A signal during the final validation came after the last decision: every step had
    // run, but the exit status (and the report) still say the run was interrupted.
    let signal = job.stop_requested();
    let late = r.stopped.is_none() && signal != 0;
    let stopped = r.stopped.or(late.then_some(Stop::Signal(signal)));
    let s = summary(r, &watch);
    let real = job.session.emulated.is_none();
    print_results(a, r, &s, &watch, real);
    print_memory_and_comm(r, real);
    // Every output is attempted: one that fails does not cost the others.
    let mut failed = Vec::new();
    if let Some(trace) = watch.trace.take() {
        failed.extend(trace.finish().err());
    }
    if let Some(path) = &a.report {
        let peaks: Vec<Value> = (0..r.plan.schedule.ranks)
            .map(|rank| {
                json!({"rank": rank, "measured_bytes": real.then(|| measured_peak(r, rank)),
                    "predicted_bytes": real.then(|| r.plan.predicted_peak[rank])})
            })
            .collect();
        let report = json_report(a, job, r, stopped, &s, watch.peak_flops, peaks);
        let text = serde_json::to_string_pretty(&report).expect("serializes") + "\n";
        failed.extend(
            crate::report::emit(Some(path), &text)
                .err()
                .map(|e| format!("--report: {e}")),
        );
    }
    if let Some(path) = &a.timeline_svg {
        let written = measured_timeline(r).and_then(|svg| crate::report::emit(Some(path), &svg));
        failed.extend(written.err().map(|e| format!("--timeline-svg: {e}")));
    }
    if !failed.is_empty() {
        return Err(failed.join("\nerror: "));
    }
    exit_status(a, r, stopped, late, real)
}

/// Steps, throughput, losses, step time, bubble and MFU.
fn print_results(a: &TrainArgs, r: &TrainReport, s: &Summary, watch: &Watch, real: bool) {
    let sim = &r.simulated.metrics;
    // A blank line under the progress on a terminal; none at the top of a file or pipe.
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        say!();
    }
    say!(
        "trained {} steps in {:.1} s ({:.0} tokens/s)",
        r.trained,
        r.elapsed,
        r.tokens_per_step * r.trained as f64 / r.elapsed.max(f64::MIN_POSITIVE)
    );
    if real {
        say!("final training loss {:.4}", r.final_loss);
    }
    let when = if r.first_step > 0 {
        format!("at step {}, where this run resumed", r.first_step)
    } else {
        "before training".to_string()
    };
    match (r.validation_before, r.validation_after) {
        (Some(before), Some(after)) => say!("validation loss {after:.4} ({when} {before:.4})"),
        (Some(before), None) => {
            say!("validation loss {when} {before:.4} (not measured again: the run was stopped)")
        }
        _ => {}
    }
    let span_ms = s.span_s * 1e3;
    say!(
        "step time: measured {:.2} ms per step (wall), {:.2} ms per iteration (span of its passes); simulated {:.2} ms from the measured pass times ({:+.1}%)",
        r.wall_per_step * 1e3,
        span_ms,
        sim.makespan,
        100.0 * (span_ms / sim.makespan - 1.0)
    );
    say!(
        "bubble fraction: measured {:.1}%, simulated {:.1}%; bubble rate (longest rank span): measured {:.1}%, simulated {:.1}%",
        100.0 * s.bubble,
        100.0 * sim.bubble_fraction,
        100.0 * s.bubble_rate,
        100.0 * sim.bubble_rate
    );
    if let Some(line) = work_line(&sim.busy) {
        say!("{line}");
    }
    if let (Some(mfu), Some(peak)) = (s.mfu, watch.peak_flops) {
        say!("{}", mfu_line(mfu, peak, a.peak_flops.is_some()));
    }
}

/// The busiest and the least busy rank's passes per step (ms, simulated from the measured
/// pass times). Why: a bubble can come from uneven stages (the embedding's or the LM head's
/// rank works longer) rather than from the schedule, and no schedule makes a step shorter
/// than its busiest rank's work; the line tells the two apart. None for one rank.
fn work_line(busy: &[f64]) -> Option<String> {
    if busy.len() < 2 {
        return None;
    }
    let by_work = |a: &(usize, &f64), b: &(usize, &f64)| a.1.total_cmp(b.1);
    // On a tie the lower rank, as `min_by` already picks.
    let (most, &high) =
        (busy.iter().enumerate()).max_by(|a, b| by_work(a, b).then(b.0.cmp(&a.0)))?;
    let (least, &low) = busy.iter().enumerate().min_by(by_work)?;
    if high == low {
        return Some(format!(
            "work per rank: {high:.2} ms per step on every rank"
        ));
    }
    Some(format!(
        "work per rank: {high:.2} ms per step on rank {most} (the most) to {low:.2} ms on rank \
         {least} ({:+.1}%); no schedule makes a step shorter than the most",
        100.0 * (high / low.max(f64::MIN_POSITIVE) - 1.0)
    ))
}

/// The report's MFU line. The default peak is a short best-of GEMM probe at start: on a
/// busy machine it can catch a slow moment, and model FLOPs count the attention the causal
/// kernels skip; a share above 100% then says both rather than standing unexplained.
fn mfu_line(mfu: f64, peak: f64, peak_given: bool) -> String {
    let source = match (peak_given, mfu > 1.0) {
        (true, _) => ", --peak-flops",
        (false, false) => ", measured by a GEMM probe",
        (false, true) => {
            ", measured by a GEMM probe at start that may have caught a busier moment; model \
             FLOPs also count causal attention's whole square, whose part above the diagonal \
             the kernels skip; pass --peak-flops for a fixed peak"
        }
    };
    format!(
        "MFU {:.1}% (model FLOPs per second over a peak of {:.1} GFLOP/s for all ranks{source})",
        100.0 * mfu,
        peak / 1e9
    )
}

/// The largest activation memory rank `rank` reached in the steps the report covers.
fn measured_peak(r: &TrainReport, rank: usize) -> usize {
    (r.tail.iter())
        .map(|x| x.peak_bytes.get(rank).copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// Each rank's peak memory against the plan's (real compute), and its communication.
fn print_memory_and_comm(r: &TrainReport, real: bool) {
    if real {
        for rank in 0..r.plan.schedule.ranks {
            say!(
                "rank {rank}: peak activation memory {} (planner predicted {})",
                mib(measured_peak(r, rank) as f64),
                mib(r.plan.predicted_peak[rank])
            );
        }
    }
    say!("communication ({}):", r.transport);
    for (rank, c) in per_step_comm(r).iter().enumerate() {
        let mut line = format!(
            "  rank {rank}: {:.0} messages, {} sent per step; sending {:.3} ms, waiting {:.2} ms per step; link latency {:.3} ms",
            c.sent,
            nobubble_runtime::session::human_bytes(c.sent_bytes),
            1e3 * c.send_seconds,
            1e3 * c.wait_seconds,
            r.comm.get(rank).map_or(0.0, |t| t.mean_latency_ms())
        );
        if r.replicas > 1 {
            line.push_str(&format!(
                "; gradient reduction {:.2} ms per step",
                1e3 * c.reduce_seconds
            ));
        }
        if c.borrowed_products > 0.0 {
            line.push_str(&format!(
                "; {:.1} matrix products per step on a core lent by a waiting rank",
                c.borrowed_products
            ));
        }
        say!("{line}");
    }
}

/// `--timeline-svg`'s picture: the last recorded step, measured, above the plan.
fn measured_timeline(r: &TrainReport) -> Result<String, String> {
    let Some(last) = r.tail.last() else {
        return Err("--timeline-svg: no step was recorded to draw".into());
    };
    // The first replica's ranks: the schedule's (the others run the same one).
    let measured: Vec<Vec<Slot>> = (last.timeline.iter())
        .take(r.plan.schedule.ranks)
        .map(|slots| {
            (slots.iter())
                .map(|m| Slot {
                    action: m.action,
                    start: m.start * 1e3,
                    end: m.end * 1e3,
                    waited_for: None,
                })
                .collect()
        })
        .collect();
    let title = format!("measured: step {} of this run", last.step + 1);
    let planned = "planned: the simulator on the measured median pass times";
    Ok(svg::render_measured(
        &r.plan.schedule,
        &measured,
        &r.simulated,
        [&title, planned],
    ))
}

/// 0, or 128 + the signal that stopped the run; an error for a run that diverged or was
/// stopped by non-finite losses.
fn exit_status(
    a: &TrainArgs,
    r: &TrainReport,
    stopped: Option<Stop>,
    late: bool,
    real: bool,
) -> Result<u8, String> {
    // A run that trained all its steps and diverged says so, even if a signal came late.
    let diverged = real && !r.final_loss.is_finite();
    match stopped {
        Some(Stop::NonFinite { steps, last }) => {
            return Err(format!(
                "stopped: the training loss was not finite for {steps} steps in a row (up to step {}); \
                 lower --lr, keep --max-grad-norm, or check the data (--max-nan-steps sets how many are tolerated)",
                last + 1
            ));
        }
        Some(Stop::Signal(sig)) if !(late && diverged) => {
            let status = 128u8.saturating_add(u8::try_from(sig).unwrap_or(127));
            let done = r.first_step + r.trained;
            if late {
                tell!(
                    "signal {sig} came after the last step: the run had trained all its steps \
                     (exit status {status})"
                );
            } else {
                let resume = match (r.saved_at, &a.save) {
                    (Some(k), Some(dir)) if k == done => {
                        format!("; continue with --resume {}", dir.display())
                    }
                    (_, Some(_)) => "; this step was not saved (see above)".to_string(),
                    (_, None) => "; nothing was saved (no --save)".to_string(),
                };
                if sig == crate::signals::OUTPUT_CLOSED as i32 {
                    let what = crate::output::failure().unwrap_or("its output");
                    tell!("stopped after step {done}: cannot write {what}{resume}");
                } else {
                    tell!("stopped by signal {sig} after step {done}{resume}");
                }
            }
            return Ok(status);
        }
        _ => {}
    }
    if diverged {
        return Err(format!(
            "the final training loss is {}: the run diverged (lower --lr, keep --max-grad-norm, or check the data)",
            r.final_loss
        ));
    }
    Ok(0)
}

/// One rank's communication in a mean step.
struct StepComm {
    sent: f64,
    sent_bytes: f64,
    send_seconds: f64,
    wait_seconds: f64,
    reduce_seconds: f64,
    borrowed_products: f64,
}

/// Per-rank means over the steps the report covers (each step's own traffic, so setup,
/// validation and checkpoint traffic do not count); the whole job's totals per step when no
/// step was recorded.
fn per_step_comm(r: &TrainReport) -> Vec<StepComm> {
    let of = |c: &nobubble_runtime::CommStats, k: f64| StepComm {
        sent: c.sent as f64 / k,
        sent_bytes: c.sent_bytes as f64 / k,
        send_seconds: c.send_seconds / k,
        wait_seconds: c.wait_seconds / k,
        reduce_seconds: c.reduce_seconds / k,
        borrowed_products: c.borrowed_products as f64 / k,
    };
    if r.tail.is_empty() {
        let k = r.trained.max(1) as f64;
        return r.comm.iter().map(|c| of(c, k)).collect();
    }
    let k = r.tail.len() as f64;
    (0..r.comm.len())
        .map(|rank| {
            let parts: Vec<StepComm> = r
                .tail
                .iter()
                .filter_map(|rec| rec.comm.get(rank))
                .map(|c| of(c, k))
                .collect();
            StepComm {
                sent: parts.iter().map(|c| c.sent).sum(),
                sent_bytes: parts.iter().map(|c| c.sent_bytes).sum(),
                send_seconds: parts.iter().map(|c| c.send_seconds).sum(),
                wait_seconds: parts.iter().map(|c| c.wait_seconds).sum(),
                reduce_seconds: parts.iter().map(|c| c.reduce_seconds).sum(),
                borrowed_products: parts.iter().map(|c| c.borrowed_products).sum(),
            }
        })
        .collect()
}

/// `--report`: stable field names, seconds and bytes.
fn json_report(
    a: &TrainArgs,
    job: &TrainJob,
    r: &TrainReport,
    stopped: Option<Stop>,
    s: &Summary,
    peak: Option<f64>,
    peaks: Vec<Value>,
) -> Value {
    let sim = &r.simulated.metrics;
    let schedule = &r.plan.schedule;
    let real = job.session.emulated.is_none();
    json!({
        "schedule": schedule.name,
        "schedule_file": job.session.file.as_ref().map(|_| &a.schedule),
        "ranks": schedule.ranks,
        "stages": schedule.stages,
        "microbatches": schedule.microbatches,
        "data_parallel": r.replicas,
        "transport": r.transport,
        "compute": if real { "real" } else { "emulated" },
        "first_step": r.first_step,
        "steps_trained": r.trained,
        "stopped": match stopped {
            None => Value::Null,
            Some(Stop::Signal(sig)) => json!({"signal": sig}),
            Some(Stop::NonFinite { steps, last }) => json!({"non_finite_steps": steps, "last_log_step": last}),
        },
        "elapsed_seconds": r.elapsed,
        "tokens_per_second": r.tokens_per_step * r.trained as f64 / r.elapsed.max(f64::MIN_POSITIVE),
        "steps_measured": r.tail.len(),
        "step_seconds": {"measured_wall": r.wall_per_step, "measured_span": s.span_s, "simulated": sim.makespan / 1e3},
        "bubble_fraction": {"measured": s.bubble, "simulated": sim.bubble_fraction},
        "bubble_rate": {"measured": s.bubble_rate, "simulated": sim.bubble_rate},
        "work_seconds_per_rank": sim.busy.iter().map(|b| b / 1e3).collect::<Vec<_>>(),
        "mfu": s.mfu,
        "peak_flops": peak,
        "peak_flops_source": peak.map(|_| if a.peak_flops.is_some() { "--peak-flops" } else { "GEMM probe" }),
        "peak_activation_memory": peaks,
        "communication_per_step": per_step_comm(r).iter().enumerate().map(|(rank, c)| json!({
            "rank": rank, "messages": c.sent, "sent_bytes": c.sent_bytes,
            "send_seconds": c.send_seconds, "wait_seconds": c.wait_seconds,
            "reduce_seconds": c.reduce_seconds, "borrowed_products": c.borrowed_products,
        })).collect::<Vec<_>>(),
        "loss": {
            "final_training": real.then_some(r.final_loss).filter(|l| l.is_finite()),
            "validation_before": r.validation_before,
            "validation_after": r.validation_after,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::{mfu_line, work_line};

    #[test]
    fn the_work_line_names_the_busiest_and_the_least_busy_rank() {
        assert_eq!(work_line(&[993.2]), None);
        let line = work_line(&[993.2, 945.0, 960.0]).unwrap();
        assert!(
            line.starts_with("work per rank: 993.20 ms per step on rank 0 (the most) to 945.00 ms on rank 1 (+5.1%)"),
            "{line}"
        );
        assert_eq!(
            work_line(&[5.0, 5.0]).unwrap(),
            "work per rank: 5.00 ms per step on every rank"
        );
        let line = work_line(&[12.0, 10.0, 12.0]).unwrap();
        assert!(
            line.contains("12.00 ms per step on rank 0 (the most)"),
            "{line}"
        );
        let line = work_line(&[10.0, 12.0]).unwrap();
        assert!(
            line.contains("12.00 ms per step on rank 1") && line.contains("(+20.0%)"),
            "{line}"
        );
    }

    #[test]
    fn an_mfu_above_the_probed_peak_says_why_and_what_to_do() {
        let line = mfu_line(0.853, 191.3e9, false);
        assert!(
            line.starts_with("MFU 85.3% ") && line.contains("191.3 GFLOP/s"),
            "{line}"
        );
        assert!(line.ends_with("measured by a GEMM probe)"), "{line}");
        let over = mfu_line(1.034, 160.7e9, false);
        assert!(
            over.starts_with("MFU 103.4% ") && over.contains("--peak-flops"),
            "{over}"
        );
        assert!(
            over.contains("busier") && over.contains("whole square"),
            "{over}"
        );
        // A peak the user gave is theirs to judge.
        assert!(mfu_line(1.2, 1e11, true).ends_with(", --peak-flops)"));
    }
}
