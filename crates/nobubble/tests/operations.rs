//! Operating a run: live metrics scraped over HTTP and checked by promtool, a clean stop on
//! SIGINT that resumes bit-identically, a user's schedule file, the report and pictures, the
//! names people type, the NaN stop, and the forecast against hand calculations.

mod common;
use common::{fails, micro_train, ok};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-ops-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `train` child with its stderr collected line by line.
struct Run {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Run {
    fn start(args: &[&str]) -> Run {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nobubble"))
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("binary starts");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().unwrap();
        let lines = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Run { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Waits up to `limit` for `cond`, killing the child (only it, by its id) on timeout.
    fn wait_until(&mut self, limit: Duration, what: &str, cond: impl Fn(&Run) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            if start.elapsed() > limit || matches!(self.child.try_wait(), Ok(Some(_))) {
                if cond(self) {
                    return;
                }
                let _ = self.child.kill();
                panic!("timed out waiting for {what}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `limit` for the exit; returns (status code, stdout).
    fn finish(mut self, limit: Duration) -> (Option<i32>, String, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut out = String::new();
                std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut out)
                    .unwrap();
                // Let the reader thread drain stderr.
                std::thread::sleep(Duration::from_millis(50));
                return (status.code(), out, self.stderr());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the run did not end within {limit:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l:?}: {e}")))
        .collect()
}

/// The value of sample `name` (with its labels, as written) in an exposition text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

/// `promtool check metrics` on `text`: clean, or only the lint about the unit in
/// `active_microbatch_memory_mb`, a name the deployment checklist fixes.
fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian package `prometheus`; .ci/run installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !l.starts_with(
                "active_microbatch_memory_mb metric names should not contain abbreviated units",
            )
        })
        .collect();
    assert!(
        problems.is_empty() && matches!(out.status.code(), Some(0) | Some(3)),
        "promtool: {:?}\n{said}\n--- metrics:\n{text}",
        out.status
    );
}

#[test]
fn metrics_scraped_during_a_run_match_the_log_and_pass_promtool() {
    let d = temp("metrics");
    let log = d.join("log.jsonl");
    let mut run = Run::start(&[
        "train",
        "--model",
        "micro",
        "--steps",
        "600",
        "--eval-sets",
        "1",
        "--metrics-addr",
        "127.0.0.1:0",
        "--log",
        log.to_str().unwrap(),
    ]);
    run.wait_until(Duration::from_secs(60), "the metrics address", |r| {
        r.stderr().contains("serving metrics at http://")
    });
    let err = run.stderr();
    let url = err
        .lines()
        .find_map(|l| l.strip_prefix("serving metrics at "))
        .unwrap()
        .trim()
        .to_string();
    // Scrape while it trains; keep the last scrape that shows a step.
    let mut last = None;
    let mut scrapes = 0;
    let start = Instant::now();
    while run.child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(120) {
        if let Ok(mut resp) = ureq::get(&url).call() {
            assert!(resp
                .headers()
                .get("content-type")
                .is_some_and(|v| v.to_str().unwrap().starts_with("text/plain; version=0.0.4")));
            let body = resp.body_mut().read_to_string().unwrap();
            if sample(&body, "nobubble_step").is_some() {
                scrapes += 1;
                last = Some(body);
            }
        }
        std::thread::sleep(Duration::from_millis(15));
    }
    let base = url.trim_end_matches("/metrics").to_string();
    let (code, _, err) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(scrapes >= 2, "only {scrapes} scrapes saw a step");
    let text = last.unwrap();
    promtool_accepts(&text);
    // The scraped step's values are the log's for that step.
    let step = sample(&text, "nobubble_step").unwrap() as u64;
    let lines = log_lines(&log);
    let line = lines.iter().find(|l| l["step"] == step).unwrap();
    let f = |k: &str| line[k].as_f64().unwrap();
    assert!(close(sample(&text, "nobubble_loss").unwrap(), f("loss")));
    assert!(close(
        sample(&text, "nobubble_grad_norm").unwrap(),
        f("grad_norm")
    ));
    assert!(close(
        sample(&text, "pipeline_bubble_fraction").unwrap(),
        f("bubble_fraction")
    ));
    assert!(close(
        sample(&text, "nobubble_tokens_per_second").unwrap(),
        f("tokens_per_s")
    ));
    assert!(close(
        sample(&text, "gpu_flop_utilization_mfu").unwrap(),
        f("mfu")
    ));
    let mfu = f("mfu");
    assert!(mfu > 0.0 && mfu < 1.5, "MFU {mfu}");
    let peaks = line["peak_activation_bytes"].as_array().unwrap();
    for (rank, bytes) in peaks.iter().enumerate() {
        let mb = sample(
            &text,
            &format!("active_microbatch_memory_mb{{rank=\"{rank}\"}}"),
        )
        .unwrap();
        assert!(close(mb, bytes.as_f64().unwrap() / 1048576.0));
    }
    // Steps so far: the histogram counts every recorded step up to this one.
    assert_eq!(
        sample(&text, "nobubble_step_seconds_count").unwrap() as u64,
        step
    );
    let planned = sample(&text, "nobubble_planned_bubble_fraction").unwrap();
    assert!(planned > 0.0 && planned < 1.0);
    // Idle seconds: the sum over the log's steps up to this one of span − busy is positive
    // and no more than the summed spans.
    let spans: f64 = lines
        .iter()
        .filter(|l| l["step"].as_u64().unwrap() <= step)
        .map(|l| l["span_seconds"].as_f64().unwrap())
        .sum();
    for rank in 0..2 {
        let idle = sample(
            &text,
            &format!("nobubble_rank_idle_seconds_total{{rank=\"{rank}\"}}"),
        )
        .unwrap();
        assert!(idle >= 0.0 && idle <= spans, "{idle} vs {spans}");
    }
    // Every metric the shipped dashboard queries is served.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/grafana/nobubble-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut queried = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("nobubble_")
                    || word.starts_with("pipeline_")
                    || word.starts_with("gpu_")
                    || word.starts_with("active_")
                {
                    queried += 1;
                    assert!(
                        text.lines().any(|l| l.starts_with(word)),
                        "the dashboard queries {word}, which /metrics does not serve"
                    );
                }
            }
        }
    }
    assert!(queried >= 10);
    // The server is gone with the run.
    assert!(ureq::get(&format!("{base}/metrics")).call().is_err());
}

#[test]
fn a_bad_metrics_address_is_refused_before_training() {
    let e = fails(&micro_train("1", &["--metrics-addr", "nonsense"]));
    assert!(
        e.contains("--metrics-addr nonsense: cannot listen there"),
        "{e}"
    );
}

fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "train",
        "--model",
        "micro",
        "-m",
        "2",
        "--eval-sets",
        "1",
        "--warmup",
        "2",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn sigint_stops_after_a_step_writes_everything_and_resumes_bit_identically() {
    let d = temp("sigint");
    let (log, trace, report, save) = (
        d.join("a.jsonl"),
        d.join("a.trace.json"),
        d.join("a.report.json"),
        d.join("run"),
    );
    let args = train_args(&[
        "--steps",
        "100000",
        "--log",
        log.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--save",
        save.to_str().unwrap(),
    ]);
    let mut run = Run::start(&args);
    let l = log.clone();
    run.wait_until(Duration::from_secs(60), "five logged steps", move |_| {
        log_lines(&l).len() >= 5
    });
    run.signal("-INT");
    let (code, out, err) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("SIGINT received"), "{err}");
    assert!(out.contains("trained "), "the report is printed: {out}");
    // The log is complete JSON lines, one per step, in order.
    let lines = log_lines(&log);
    let k = lines.len() as u64;
    // Numbered from 1, as the console and the checkpoints number them.
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], i as u64 + 1);
    }
    let t: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let traced = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["args"]["step"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(traced, k);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["stopped"]["signal"], 2);
    assert_eq!(r["steps_trained"], k);
    let latest = std::fs::read_to_string(save.join("latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{k:06}"));
    // Resuming to k + 3 steps gives the losses of an uninterrupted run of k + 3 steps.
    let total = (k + 3).to_string();
    let (b, reference) = (d.join("b.jsonl"), d.join("ref.jsonl"));
    ok(&train_args(&[
        "--steps",
        &total,
        "--resume",
        save.to_str().unwrap(),
        "--log",
        b.to_str().unwrap(),
    ]));
    ok(&train_args(&[
        "--steps",
        &total,
        "--log",
        reference.to_str().unwrap(),
    ]));
    let resumed: Vec<Value> = lines.into_iter().chain(log_lines(&b)).collect();
    let straight = log_lines(&reference);
    assert_eq!(resumed.len(), straight.len());
    for (x, y) in resumed.iter().zip(&straight) {
        assert_eq!(x["step"], y["step"]);
        assert_eq!(x["loss"], y["loss"], "step {}", x["step"]);
    }
}

#[test]
fn a_closed_output_stops_the_run_cleanly_and_keeps_its_checkpoint() {
    // `nobubble train … 2>&1 | tee log` whose tee ends: the run must not die mid-step with
    // nothing saved, but stop after its step as on Ctrl-C, and say so with SIGPIPE's status.
    let d = temp("closed");
    let (log, report, save) = (d.join("a.jsonl"), d.join("r.json"), d.join("run"));
    let args = train_args(&[
        "--steps",
        "100000",
        "--log",
        log.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--save",
        save.to_str().unwrap(),
    ]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let start = Instant::now();
    while log_lines(&log).len() < 3 {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no three logged steps within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(child.stdout.take());
    drop(child.stderr.take());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run went on after its output was closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(141), "{status:?}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["stopped"]["signal"], 13);
    let k = r["steps_trained"].as_u64().unwrap();
    assert!(k >= 3, "{k}");
    assert_eq!(
        log_lines(&log).len() as u64,
        k,
        "every trained step is logged"
    );
    let latest = std::fs::read_to_string(save.join("latest")).unwrap();
    assert_eq!(
        latest.trim(),
        format!("step-{k:06}"),
        "the last step is saved"
    );
}

#[test]
fn a_second_signal_ends_the_run_at_once() {
    // Emulated steps of several seconds: the first SIGTERM would wait for the step to end.
    let mut run = Run::start(&[
        "train",
        "--compute",
        "emulated",
        "--cost",
        "400,400,400",
        "-m",
        "8",
        "--steps",
        "50",
    ]);
    run.wait_until(Duration::from_secs(60), "the start", |r| {
        r.stderr().contains("nobubble train:")
    });
    std::thread::sleep(Duration::from_millis(700));
    run.signal("-TERM");
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    run.signal("-TERM");
    let (code, out, _) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(143));
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    assert!(!out.contains("trained "), "{out}");
}

#[test]
fn non_finite_losses_stop_the_run_with_an_error() {
    let d = temp("nan");
    let log = d.join("log.jsonl");
    let out = common::nobubble(&train_args(&[
        "--steps",
        "60",
        "--lr",
        "1e4",
        "--max-grad-norm",
        "0",
        "--log",
        log.to_str().unwrap(),
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("warning: step") && err.contains("the training loss is"),
        "{err}"
    );
    assert!(err.contains("not finite for 3 steps in a row"), "{err}");
    let lines = log_lines(&log);
    let bad = lines
        .iter()
        .filter(|l| !l["loss"].as_f64().is_some_and(f64::is_finite))
        .count();
    assert!(bad >= 3 && lines.len() < 60, "{bad} of {}", lines.len());
    // The first of the three ends the run no later than two steps after the third.
    let first_bad = lines
        .iter()
        .position(|l| !l["loss"].as_f64().is_some_and(f64::is_finite))
        .unwrap();
    assert!(
        lines.len() <= first_bad + 3 + 2,
        "{} lines, first bad {first_bad}",
        lines.len()
    );
}

#[test]
fn a_users_schedule_file_trains_like_the_named_schedule() {
    let d = temp("file");
    let csv = d.join("my-zbv.csv");
    ok(&[
        "plan",
        "-s",
        "zb-v",
        "-p",
        "2",
        "-m",
        "4",
        "-f",
        "csv",
        "-o",
        csv.to_str().unwrap(),
    ]);
    let (a, b, rep) = (
        d.join("file.jsonl"),
        d.join("named.jsonl"),
        d.join("r.json"),
    );
    ok(&micro_train(
        "4",
        &[
            "--eval-sets",
            "0",
            "--schedule",
            csv.to_str().unwrap(),
            "--log",
            a.to_str().unwrap(),
            "--report",
            rep.to_str().unwrap(),
        ],
    ));
    ok(&micro_train(
        "4",
        &[
            "--eval-sets",
            "0",
            "-m",
            "4",
            "--pipeline-schedule",
            "ScheduleZBVZeroBubble",
            "--log",
            b.to_str().unwrap(),
        ],
    ));
    let (x, y) = (log_lines(&a), log_lines(&b));
    assert_eq!(x.len(), 4);
    for (p, q) in x.iter().zip(&y) {
        assert_eq!(p["loss"], q["loss"]);
        assert_eq!(p["schedule"], "my-zbv");
        assert_eq!(q["schedule"], "zb-v");
    }
    // Placement and sizes came from the file: 4 stages (V) on 2 ranks, 4 microbatches.
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
    assert_eq!(
        (
            r["ranks"].as_u64(),
            r["stages"].as_u64(),
            r["microbatches"].as_u64()
        ),
        (Some(2), Some(4), Some(4))
    );
    assert_eq!(r["schedule_file"], csv.to_str().unwrap());
    // Flags that contradict the file, and broken files, are refused by name.
    let e = fails(&micro_train(
        "1",
        &["-m", "8", "--schedule", csv.to_str().unwrap()],
    ));
    assert!(
        e.contains("--microbatches 8 disagrees with --schedule"),
        "{e}"
    );
    let broken = d.join("broken.csv");
    std::fs::write(&broken, "0F0,0I0\n").unwrap();
    let e = fails(&micro_train("1", &["--schedule", broken.to_str().unwrap()]));
    assert!(e.contains("invalid schedule"), "{e}");
    let e = fails(&micro_train("1", &["--schedule", "nope.csv"]));
    assert!(e.contains("cannot read --schedule nope.csv"), "{e}");
}

#[test]
fn the_report_and_the_timeline_picture_describe_the_run() {
    let d = temp("report");
    let (rep, svg, log) = (d.join("r.json"), d.join("t.svg"), d.join("l.jsonl"));
    let out = ok(&micro_train(
        "6",
        &[
            "--eval-sets",
            "1",
            "-s",
            "Schedule1F1B",
            "--report",
            rep.to_str().unwrap(),
            "--timeline-svg",
            svg.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--peak-flops",
            "1e9",
        ],
    ));
    assert!(out.contains("MFU "), "{out}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
    assert_eq!(r["schedule"], "1f1b");
    assert_eq!(r["steps_trained"], 6);
    assert_eq!(r["stopped"], Value::Null);
    assert_eq!(r["peak_flops"], 1e9);
    // MFU against the given peak: model FLOPs per step / mean wall step / 1e9.
    let lines = log_lines(&log);
    let mfu = r["mfu"].as_f64().unwrap();
    let wall = r["step_seconds"]["measured_wall"].as_f64().unwrap();
    let per_step_mfu =
        lines[5]["mfu"].as_f64().unwrap() * lines[5]["step_seconds"].as_f64().unwrap();
    assert!(
        close(mfu * wall, per_step_mfu),
        "{mfu} {wall} {per_step_mfu}"
    );
    assert!(
        r["loss"]["validation_after"].as_f64().unwrap()
            < r["loss"]["validation_before"].as_f64().unwrap()
    );
    for p in r["peak_activation_memory"].as_array().unwrap() {
        assert_eq!(p["measured_bytes"].as_f64(), p["predicted_bytes"].as_f64());
    }
    // Communication per step: the mean of the measured steps' own traffic, the log's last
    // `steps_measured` lines.
    let n = r["steps_measured"].as_u64().unwrap() as usize;
    for (rank, c) in r["communication_per_step"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let logged: f64 = lines[lines.len() - n..]
            .iter()
            .map(|l| l["sent_bytes"][rank].as_f64().unwrap())
            .sum::<f64>()
            / n as f64;
        assert!(
            close(c["sent_bytes"].as_f64().unwrap(), logged),
            "{c} vs {logged}"
        );
    }
    let bubble = r["bubble_fraction"]["measured"].as_f64().unwrap();
    assert!(bubble > 0.0 && bubble < 1.0);
    // Each rank's work per step (seconds): within the simulated step, and the idle rest is
    // the simulated bubble fraction; the text names the busiest rank.
    let step = r["step_seconds"]["simulated"].as_f64().unwrap();
    let work: Vec<f64> = (r["work_seconds_per_rank"].as_array().unwrap().iter())
        .map(|w| w.as_f64().unwrap())
        .collect();
    assert_eq!(work.len(), 2);
    assert!(
        work.iter().all(|&w| w > 0.0 && w <= step * (1.0 + 1e-9)),
        "{work:?} {step}"
    );
    let idle = 1.0 - work.iter().sum::<f64>() / (2.0 * step);
    assert!(close(
        idle,
        r["bubble_fraction"]["simulated"].as_f64().unwrap()
    ));
    let busiest = if work[0] >= work[1] { 0 } else { 1 };
    let line = if work[0] == work[1] {
        format!("{:.2} ms per step on every rank", work[0] * 1e3)
    } else {
        format!(
            "{:.2} ms per step on rank {busiest} (the most)",
            work[busiest] * 1e3
        )
    };
    assert!(
        out.contains("work per rank: ") && out.contains(&line),
        "{out}"
    );
    // Two panels, each with every pass of the step: 2 ranks × 8 microbatches × (F, B).
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("measured: step 6"));
    assert!(picture.contains("planned: the simulator"));
    assert_eq!(picture.matches("<title>").count(), 2 * 2 * 8 * 2);
}

#[test]
fn forecast_matches_a_hand_calculation() {
    // 8 stages × 4 layers of h 4096 at s 1024 on A100s at 50%: the seed's example.
    let out = ok(&[
        "forecast", "--tokens", "1B", "--layers", "32", "--hidden", "4096", "--heads", "32", "-p",
        "8", "-m", "16", "--json",
    ]);
    let j: Value = serde_json::from_str(&out).unwrap();
    let rows = j["schedules"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["schedule"] == name).unwrap();
    let one = row("1f1b");
    let (s, h) = (1024.0f64, 4096.0f64);
    let pass = 4.0 * (72.0 * s * h * h + 12.0 * s * s * h) / (312e12 * 0.5);
    let step = 23.0 * pass; // m + p − 1 = 23 slots of F+I+W
    let steps = (1e9f64 / (16.0 * 1024.0)).ceil();
    assert!(close(one["bubble"].as_f64().unwrap(), 7.0 / 23.0));
    assert!((one["step_seconds"].as_f64().unwrap() / step - 1.0).abs() < 1e-9);
    assert_eq!(one["steps"].as_f64().unwrap(), steps);
    let hours = steps * step / 3600.0 * 8.0;
    assert!((one["gpu_hours"].as_f64().unwrap() / hours - 1.0).abs() < 1e-9);
    assert!((one["cost"].as_f64().unwrap() / (2.0 * hours) - 1.0).abs() < 1e-9);
    assert!(row("zb-2p")["bubble"].as_f64().unwrap() < 0.02);
    assert!(row("zb-2p")["saving_vs_1f1b"].as_f64().unwrap() > 0.28);
    // The table says the same; bad input names the fix.
    let table = ok(&[
        "forecast", "--tokens", "1B", "--params", "7B", "--gpu", "H100", "--gpus", "16",
    ]);
    assert!(
        table.contains("zb-2p") && table.contains("saving") && table.contains("H100"),
        "{table}"
    );
    let e = fails(&[
        "forecast", "--tokens", "1B", "--params", "7B", "--gpus", "12",
    ]);
    assert!(e.contains("not a multiple of --stages 8"), "{e}");
    let e = fails(&["forecast", "--tokens", "lots", "--params", "7B"]);
    assert!(e.contains("--tokens: `lots`"), "{e}");
    let e = fails(&["forecast", "--tokens", "1e30", "--params", "7B"]);
    assert!(e.contains("--tokens: 1e30 is beyond"), "{e}");
    let e = fails(&[
        "forecast", "--tokens", "1B", "--layers", "32", "--hidden", "4096", "--heads", "31",
    ]);
    assert!(
        e.contains("--heads: 31 heads do not divide the hidden size 4096"),
        "{e}"
    );
    let e = fails(&[
        "forecast", "--tokens", "1B", "--params", "7B", "--gpu", "V100",
    ]);
    assert!(e.contains("--gpu V100: unknown"), "{e}");
}

#[test]
fn a_signal_during_the_last_step_still_counts() {
    // One emulated step of a few seconds: the signal arrives while it runs, after which no
    // step is left to skip — but the run says it was interrupted, in its status and report.
    let d = temp("last");
    let report = d.join("r.json");
    let mut run = Run::start(&[
        "train",
        "--compute",
        "emulated",
        "--cost",
        "300,300,300",
        "-m",
        "4",
        "--steps",
        "1",
        "--report",
        report.to_str().unwrap(),
    ]);
    run.wait_until(Duration::from_secs(60), "the start", |r| {
        r.stderr().contains("nobubble train:")
    });
    std::thread::sleep(Duration::from_millis(800));
    run.signal("-TERM");
    let (code, out, err) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(143), "{err}");
    assert!(out.contains("trained 1 steps"), "{out}");
    assert!(err.contains("stopping after step 1 (signal 15)"), "{err}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["stopped"]["signal"], 15);
}
