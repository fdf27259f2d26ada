//! Ranks as processes: `mpirun -np N nobubble train …` against the in-process runtime
//! (which `tests/bit_identical.rs` of the runtime holds to the reference trainer), data
//! parallelism, a rank that dies, and checkpoints moving between threads and processes.
//!
//! Needs the `mpi` feature and Open MPI's `mpirun` (CI installs both). Every launch is bounded
//! in time; on a time-out only the `mpirun` this test started is killed (by its id), which
//! takes its ranks with it.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nobubble");

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-mpi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mpirun(np: usize, extra: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            &np.to_string(),
        ])
        .args(extra)
        .arg(BIN);
    c
}

/// Runs `cmd` for at most `limit`; kills it (and only it) if it takes longer.
fn bounded(mut cmd: Command, limit: Duration) -> (Output, Duration) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command (is Open MPI installed?)");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "timed out after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t.elapsed();
    (child.wait_with_output().unwrap(), took)
}

/// Runs `cmd`, which must fail, and within 20 s; its stderr.
fn fails_within_20s(cmd: Command) -> String {
    let (out, took) = bounded(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    stderr
}

fn ok(cmd: Command) -> Output {
    let (out, _) = bounded(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The loss, clip factor and skip flag of every step, as the log wrote them.
fn steps(log: &Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["loss"].to_string(),
                v["clip_scale"].to_string(),
                v["skipped"].to_string(),
            )
        })
        .collect()
}

/// `train` with a small model; writes `dir/NAME.jsonl` and saves to `dir/NAME`.
fn train_args(dir: &Path, name: &str, rest: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--model",
        "micro",
        "--eval-sets",
        "1",
        "--max-grad-norm",
        "0.5",
        "--recv-timeout",
        "30",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push("--log".into());
    a.push(dir.join(format!("{name}.jsonl")).display().to_string());
    a.push("--save".into());
    a.push(dir.join(name).display().to_string());
    a.extend(rest.iter().map(|s| s.to_string()));
    a
}

fn threads(dir: &Path, name: &str, rest: &[&str]) {
    let mut c = Command::new(BIN);
    c.args(train_args(dir, name, rest));
    ok(c);
}

fn processes(np: usize, dir: &Path, name: &str, rest: &[&str]) -> Output {
    let mut c = mpirun(np, &[]);
    c.args(train_args(dir, name, rest));
    ok(c)
}

/// The newest checkpoint of a run directory.
fn latest(run: &Path) -> PathBuf {
    let name = std::fs::read_to_string(run.join("latest")).unwrap();
    run.join(name.trim())
}

fn same_run(dir: &Path, a: &str, b: &str) {
    assert_eq!(
        steps(&dir.join(format!("{a}.jsonl"))),
        steps(&dir.join(format!("{b}.jsonl"))),
        "{a} and {b}: losses differ"
    );
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let x = std::fs::read(latest(&dir.join(a)).join(f)).unwrap();
        let y = std::fs::read(latest(&dir.join(b)).join(f)).unwrap();
        assert!(x == y, "{a} and {b}: {f} differs");
    }
}

#[test]
fn processes_train_bit_identically_to_threads_under_every_kind_of_schedule() {
    let dir = temp("schedules");
    for s in [
        "1f1b",
        "zb-h1",
        "zb-2p",
        "zb-v",
        "interleaved-1f1b",
        "zb-auto",
    ] {
        let rest = [
            "-s", s, "-p", "2", "-m", "4", "--layers", "4", "--steps", "3",
        ];
        threads(&dir, &format!("{s}-t"), &rest);
        let out = processes(2, &dir, &format!("{s}-p"), &rest);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("(MPI ("), "{stderr}");
        same_run(&dir, &format!("{s}-t"), &format!("{s}-p"));
    }
    for s in ["1f1b", "zb-2p", "zb-v"] {
        let rest = [
            "-s", s, "-p", "4", "-m", "8", "--layers", "8", "--steps", "2",
        ];
        threads(&dir, &format!("{s}-t4"), &rest);
        processes(4, &dir, &format!("{s}-p4"), &rest);
        same_run(&dir, &format!("{s}-t4"), &format!("{s}-p4"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn llama_blocks_train_bit_identically_over_processes_and_threads() {
    let dir = temp("llama");
    // Tied embeddings: across ranks (zb-h1) and on one rank (zb-v puts both ends on rank 0).
    for (s, extra) in [
        ("zb-h1", "--tie-embeddings"),
        ("zb-v", "--tie-embeddings"),
        ("zb-v", "--seed=1"),
    ] {
        let mut rest = vec![
            "-s", s, "-p", "2", "-m", "4", "--layers", "4", "--steps", "3",
        ];
        rest.extend(["--arch", "llama", "--data-parallel", "2", extra]);
        let name = format!("{s}{extra}");
        threads(&dir, &format!("{name}-t"), &rest);
        let out = processes(4, &dir, &format!("{name}-p"), &rest);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("model llama micro"), "{stderr}");
        same_run(&dir, &format!("{name}-t"), &format!("{name}-p"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn data_parallel_processes_equal_one_pipeline_of_the_global_batch() {
    let dir = temp("dp");
    let one = ["-s", "zb-h1", "-p", "2", "-m", "8", "--steps", "3"];
    let dp = [
        "-s",
        "zb-h1",
        "-p",
        "2",
        "-m",
        "4",
        "--data-parallel",
        "2",
        "--steps",
        "3",
    ];
    threads(&dir, "one", &one);
    processes(4, &dir, "dp", &dp);
    same_run(&dir, "one", "dp");
    // Clipping binds at --max-grad-norm 0.5: the clip factors are in the logs, equal too.
    assert!(steps(&dir.join("one.jsonl"))
        .iter()
        .any(|s| s.1.parse::<f64>().unwrap() < 1.0));
    // Post-validated, with a NaN injected at step 1: skipped everywhere, same weights.
    let nan = ["--inject-fault", "nan-grad-at:1"];
    let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(more).copied().collect()
    };
    threads(&dir, "one-nan", &with(&one, &nan));
    processes(
        4,
        &dir,
        "dp-post-nan",
        &with(&dp, &with(&nan, &["--post-validate"])),
    );
    same_run(&dir, "one-nan", "dp-post-nan");
    let skipped: Vec<String> = steps(&dir.join("dp-post-nan.jsonl"))
        .into_iter()
        .map(|s| s.2)
        .collect();
    assert_eq!(skipped, ["false", "true", "false"]);
    // Post-validated without a fault (clipped steps redone): the synchronous bits.
    processes(4, &dir, "dp-post", &with(&dp, &["--post-validate"]));
    same_run(&dir, "one", "dp-post");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_world_that_does_not_match_the_flags_is_refused_on_every_rank() {
    let mut c = mpirun(3, &[]);
    c.args(["train", "--model", "micro", "-p", "2", "--steps", "1"]);
    let (out, _) = bounded(c, Duration::from_secs(60));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for r in 0..3 {
        assert!(
            stderr.contains(&format!(
                "error: rank {r}: the job has 3 ranks, but --stages 2 × --data-parallel 1 needs 2"
            )),
            "{stderr}"
        );
    }
}

/// Ranks on CPUs of different vector widths would multiply with different kernels (results
/// differ in the last bits): the job is refused on every rank, naming the level to set.
#[test]
fn ranks_with_different_simd_levels_are_refused() {
    let train = ["train", "--model", "micro", "-p", "2", "--steps", "1"];
    // Two programs in one job (MPMD): rank 0 on avx2, rank 1 on portable kernels.
    let mut c = mpirun(1, &["-x", "NOBUBBLE_SIMD=avx2"]);
    c.args(train)
        .args([":", "-np", "1", "-x", "NOBUBBLE_SIMD=portable", BIN])
        .args(train);
    let stderr = fails_within_20s(c);
    let said = "error: rank 1 runs the portable kernels and rank 0 the avx2";
    assert_eq!(
        stderr.matches(said).count(),
        2,
        "both ranks say it: {stderr}"
    );
    assert!(
        stderr.contains("set NOBUBBLE_SIMD=portable on every process"),
        "{stderr}"
    );
}

#[test]
fn a_rank_that_dies_ends_the_job_naming_it() {
    // The rank exits; mpirun is told not to end the job for it, so the other rank must notice
    // by itself: at its receive deadline, naming the lost rank and the message, then
    // MPI_Abort. Over TCP, as between machines: Open MPI's shared-memory transport can leave a
    // receiver inside MPI when a peer dies with a message half copied (mpirun's default, to
    // end the job when a process dies, covers that case; see the test below).
    let mut c = mpirun(
        2,
        &[
            "--mca",
            "orte_abort_on_non_zero_status",
            "0",
            "--mca",
            "btl",
            "self,tcp",
        ],
    );
    c.args([
        "train",
        "--model",
        "micro",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "4",
        "--steps",
        "50",
        "--recv-timeout",
        "2",
        "--inject-fault",
        "exit-at:1F2",
    ]);
    let stderr = fails_within_20s(c);
    assert!(
        stderr.contains("error: rank 0")
            && stderr.contains("waited 2.0 s")
            && stderr.contains("from stage 1 on rank 1"),
        "{stderr}"
    );
}

#[test]
fn a_panicking_rank_ends_the_job_with_its_rank_and_action() {
    let mut c = mpirun(2, &[]);
    c.args([
        "train",
        "--model",
        "micro",
        "-p",
        "2",
        "-m",
        "4",
        "--steps",
        "5",
        "--inject-fault",
        "panic-at:1I2",
    ]);
    let stderr = fails_within_20s(c);
    assert!(
        stderr.contains(
            "error: rank 1, stage 1, action 1I2: the worker panicked: injected fault at 1I2"
        ),
        "{stderr}"
    );
}

#[test]
fn a_killed_rank_process_ends_the_job() {
    let dir = temp("kill");
    let log = dir.join("log.jsonl");
    let mut c = mpirun(2, &[]);
    c.args([
        "train", "--model", "micro", "-p", "2", "-m", "4", "--steps", "100000", "--log",
    ])
    .arg(&log)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let t = Instant::now();
    let mut child = c.spawn().unwrap();
    // Wait until training runs, then kill -9 rank 1's process: a child of our mpirun whose
    // environment says rank 1.
    let victim = loop {
        let started = std::fs::read_to_string(&log).map_or(0, |s| s.lines().count());
        if started > 2 {
            if let Some(pid) = child_with_rank(child.id(), 1) {
                break pid;
            }
        }
        if t.elapsed() > Duration::from_secs(60) {
            // Stop what this test started (it would train on), and say what it printed.
            let out = stop(child);
            panic!(
                "training never started, or rank 1's process was not found: {started} log \
                 lines after 60 s; the job's stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let killed_at = Instant::now();
    // SAFETY: sends SIGKILL to a process this test's mpirun started.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if killed_at.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the job did not end after a rank was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rank 1"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ends a job this test started: SIGTERM to its `mpirun`, which stops its ranks, and after
/// 10 s SIGKILL; returns what it printed.
fn stop(mut child: std::process::Child) -> std::process::Output {
    // SAFETY: sends SIGTERM to the mpirun this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

/// The child of `parent` (pid) that is MPI rank `rank`.
fn child_with_rank(parent: u32, rank: usize) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 is the parent pid (after the parenthesized command name).
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        if env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn checkpoints_move_between_processes_and_threads() {
    let dir = temp("resume");
    let base = ["-s", "zb-h1", "-p", "2", "-m", "8"];
    let with =
        |more: &[&'static str]| -> Vec<&'static str> { base.iter().chain(more).copied().collect() };
    // Uninterrupted: 6 steps in threads.
    threads(&dir, "full", &with(&["--steps", "6"]));
    // Saved by processes at step 3, resumed by threads.
    processes(2, &dir, "half-mpi", &with(&["--steps", "3"]));
    let resume = dir.join("half-mpi").display().to_string();
    let resume: &'static str = Box::leak(resume.into_boxed_str());
    threads(
        &dir,
        "rest-threads",
        &with(&["--steps", "6", "--resume", resume]),
    );
    // Saved by threads at step 3, resumed by processes as 2 stages × 2 replicas of 4.
    threads(&dir, "half-threads", &with(&["--steps", "3"]));
    let resume2 = dir.join("half-threads").display().to_string();
    let resume2: &'static str = Box::leak(resume2.into_boxed_str());
    processes(
        4,
        &dir,
        "rest-mpi",
        &[
            "-s",
            "zb-h1",
            "-p",
            "2",
            "-m",
            "4",
            "--data-parallel",
            "2",
            "--steps",
            "6",
            "--resume",
            resume2,
        ],
    );
    let full = steps(&dir.join("full.jsonl"));
    for name in ["rest-threads", "rest-mpi"] {
        assert_eq!(
            steps(&dir.join(format!("{name}.jsonl"))),
            full[3..].to_vec(),
            "{name}"
        );
        let x = std::fs::read(latest(&dir.join("full")).join("model.safetensors")).unwrap();
        let y = std::fs::read(latest(&dir.join(name)).join("model.safetensors")).unwrap();
        assert!(
            x == y,
            "{name}: final weights differ from the uninterrupted run's"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rank_0_serves_every_ranks_metrics_and_ctrl_c_on_mpirun_stops_the_job_cleanly() {
    metrics_then_stop("ops-mpirun", false);
}

#[test]
fn a_signal_to_another_rank_alone_stops_the_job_cleanly() {
    metrics_then_stop("ops-rank1", true);
}

/// A job serving metrics; after a scrape that shows both ranks, SIGINT to `mpirun` (as a
/// user's Ctrl-C) or SIGTERM to rank 1's process only. Either way every rank stops after one
/// agreed step, rank 0 saves it and the log is whole.
fn metrics_then_stop(name: &str, signal_rank_1: bool) {
    let d = temp(name);
    let (log, run_dir) = (d.join("log.jsonl"), d.join("run"));
    let mut cmd = mpirun(2, &[]);
    cmd.args([
        "train",
        "--model",
        "micro",
        "-m",
        "2",
        "--eval-sets",
        "1",
        "--steps",
        "1000000",
        "--metrics-addr",
        "127.0.0.1:0",
    ])
    .arg("--log")
    .arg(&log)
    .arg("--save")
    .arg(&run_dir);
    let stderr_path = d.join("stderr.txt");
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("start mpirun");
    let t = Instant::now();
    let give_up = |child: &mut std::process::Child, what: &str| -> ! {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{what}; stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        )
    };
    // The address rank 0 listens on, then a scrape that shows both ranks.
    let url = loop {
        let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        if let Some(u) = err
            .lines()
            .find_map(|l| l.strip_prefix("serving metrics at "))
        {
            break u.trim().to_string();
        }
        if t.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            give_up(&mut child, "no metrics address");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Each request is bounded (a stuck connection must not outlast the deadline), and the
    // deadline is generous: on a loaded 2-core CI machine, two oversubscribed ranks measure
    // and plan before their first step. A failure shows what the last scrape returned.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut last;
    let text = loop {
        match agent.get(&url).call() {
            Ok(mut r) => {
                let body = r.body_mut().read_to_string().unwrap_or_default();
                if body.contains("active_microbatch_memory_mb{rank=\"1\"}") {
                    break body;
                }
                last = body;
            }
            Err(e) => last = format!("(error: {e})"),
        }
        if t.elapsed() > Duration::from_secs(150) || child.try_wait().unwrap().is_some() {
            let steps = std::fs::read_to_string(&log).map_or(0, |l| l.lines().count());
            give_up(
                &mut child,
                &format!("no scrape with rank 1 ({steps} steps logged); last scrape:\n{last}"),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for rank in 0..2 {
        assert!(text.contains(&format!(
            "nobubble_rank_idle_seconds_total{{rank=\"{rank}\"}}"
        )));
        // Past MPI's start, every rank ignores SIGPIPE: a peer's death closes its sockets,
        // and a write into one must not end this rank before its receive deadline can name
        // the lost rank (with the CLI's default disposition it did, and mpirun then hung).
        let Some(pid) = child_with_rank(child.id(), rank) else {
            give_up(&mut child, &format!("rank {rank}'s process not found"))
        };
        let ignored = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
        if ignored.is_none_or(|mask| mask & (1 << (libc::SIGPIPE - 1)) == 0) {
            give_up(&mut child, &format!("rank {rank} does not ignore SIGPIPE"));
        }
    }
    let (sig, target) = if signal_rank_1 {
        match child_with_rank(child.id(), 1) {
            Some(pid) => ("-TERM", pid),
            None => give_up(&mut child, "rank 1's process not found"),
        }
    } else {
        ("-INT", child.id())
    };
    let status = Command::new("kill")
        .args([sig, &target.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if stopped.elapsed() > Duration::from_secs(30) {
            give_up(&mut child, "the job did not stop");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(err.contains("stopping after step"), "{err}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let k = lines.len();
    assert!(k >= 1);
    assert_eq!(
        std::fs::read_to_string(run_dir.join("latest"))
            .unwrap()
            .trim(),
        format!("step-{k:06}")
    );
}
