//! A save killed with SIGKILL at any moment leaves a loadable checkpoint — the previous one or
//! the new one — and the next run resumes and saves into the same directory.

mod common;
use common::ok;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
        let delay = Duration::from_millis(150 + (seed >> 33) % 500);
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
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL, to the process this test started
        let _ = child.wait();
        if std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        {
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
            "trial {trial} (killed after {delay:?}): {}",
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
    // Most kills land in a save (a step takes milliseconds, a save longer): the test saw some.
    assert!(killed_in_save > 0, "no kill landed during a save");
    let _ = std::fs::remove_dir_all(&d);
}
