//! A save killed with SIGKILL at any moment leaves a loadable checkpoint — the previous one or
//! the new one — and the next run resumes and saves into the same directory.

mod common;
use common::ok;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

#[test]
fn a_save_killed_at_random_points_leaves_a_loadable_checkpoint() {
    let d = std::env::temp_dir().join(format!("nobubble-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let run = d.join("run");
    let r = run.to_str().unwrap().to_string();
    // A first checkpoint, then runs that save every step and are killed part-way.
    ok(&[
        "train",
        "--model",
        "micro",
        "-m",
        "2",
        "--steps",
        "1",
        "--eval-sets",
        "1",
        "--save",
        &r,
    ]);
    let log = d.join("log.jsonl");
    let l = log.to_str().unwrap().to_string();
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    let mut killed_in_save = 0;
    for trial in 0..25 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis((seed >> 33) % 40);
        let logged_before = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let stale = tmp_entries(&run);
        let mut child = Command::new(env!("CARGO_BIN_EXE_nobubble"))
            .args([
                "train",
                "--model",
                "micro",
                "-m",
                "2",
                "--steps",
                "100000",
                "--eval-sets",
                "1",
            ])
            .args([
                "--save-every",
                "1",
                "--keep-last",
                "3",
                "--resume",
                &r,
                "--save",
                &r,
                "--log",
                &l,
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("stderr")).unwrap())
            .spawn()
            .unwrap();
        // Kill relative to training, not to process start (a debug build starts slowly): once
        // the run has logged a step, either the moment a staging directory appears (even
        // trials: a kill inside a save) or after a random delay (odd trials: anywhere).
        let started = Instant::now();
        // A save in progress: a staging directory or a new `latest` that was not there
        // before this run started (a killed save leaves its own behind: a name and time).
        let in_save = |run: &std::path::Path| !tmp_entries(run).is_subset(&stale);
        let mut training = false;
        while started.elapsed() < Duration::from_secs(120) {
            if !training {
                training = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) > logged_before;
                if training && trial % 2 == 1 {
                    std::thread::sleep(delay);
                    break;
                }
            } else if in_save(&run) {
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.kill(); // SIGKILL, to the process this test started
        let status = child.wait().unwrap();
        let stderr = std::fs::read_to_string(d.join("stderr")).unwrap_or_default();
        assert!(
            training,
            "trial {trial}: no step logged within 120 s: {stderr}"
        );
        assert!(
            status.code().is_none(),
            "trial {trial}: the run ended by itself ({status}): {stderr}"
        );
        if in_save(&run) {
            killed_in_save += 1;
        }
        // The checkpoint `latest` names loads (sample reads and verifies it entirely).
        let t = Instant::now();
        let out = common::nobubble(&[
            "sample",
            "--checkpoint",
            &r,
            "--prompt",
            "x",
            "--tokens",
            "1",
        ]);
        assert!(
            out.status.success(),
            "trial {trial}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(t.elapsed() < Duration::from_secs(30));
        // Every saved step has its log line (a resumed run appends from there: no gap).
        let latest = std::fs::read_to_string(run.join("latest")).unwrap();
        let saved: u64 = latest.trim().trim_start_matches("step-").parse().unwrap();
        let logged: std::collections::BTreeSet<u64> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["step"].as_u64()
            })
            .collect();
        // Step 1 was trained without a log.
        let missing: Vec<u64> = (2..=saved).filter(|s| !logged.contains(s)).collect();
        assert!(
            missing.is_empty(),
            "trial {trial}: step {saved} saved, steps {missing:?} not logged"
        );
    }
    // The even trials aim at saves: the test saw kills land inside one.
    eprintln!("{killed_in_save} of 25 kills landed inside a save");
    // A killed save's new `latest` pointer is removed by the next save: none pile up.
    let pointers = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".latest."))
        .count();
    assert!(pointers <= 1, "{pointers} stale pointers");
    assert!(killed_in_save > 0, "no kill landed during a save");
    let _ = std::fs::remove_dir_all(&d);
}

/// The `.tmp` entries of `run` (a save's staging directory or new pointer), each with its
/// modification time: one re-created under the same name is a new entry.
fn tmp_entries(run: &std::path::Path) -> std::collections::BTreeSet<(String, SystemTime)> {
    std::fs::read_dir(run)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
                .filter_map(|e| {
                    let t = e.metadata().ok()?.modified().ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), t))
                })
                .collect()
        })
        .unwrap_or_default()
}
