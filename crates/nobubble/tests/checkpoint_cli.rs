//! `train --save / --resume` and `sample` as a user runs them.

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::{fails, micro_train, nobubble, ok};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-ckpt-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const MODEL: [&str; 6] = ["--model", "micro", "--layers", "4", "-m", "4"];

fn train(extra: &[&str], log: &Path) {
    let mut args = vec!["train", "--log", log.to_str().unwrap()];
    args.extend(MODEL);
    args.extend(["--eval-sets", "1", "--warmup", "3"]);
    args.extend(extra);
    ok(&args);
}

fn losses(log: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

#[test]
fn save_resume_and_sample() {
    let d = dir();
    let ckpt = d.join("ckpt");
    let c = ckpt.to_str().unwrap();
    // Uninterrupted: 6 steps.
    train(
        &["--steps", "6", "-s", "zb-h1", "-p", "2"],
        &d.join("full.jsonl"),
    );
    // 4 steps, saving every 2, then resume to 6 under another schedule and stage count.
    train(
        &[
            "--steps",
            "4",
            "-s",
            "zb-h1",
            "-p",
            "2",
            "--save",
            c,
            "--save-every",
            "2",
        ],
        &d.join("a.jsonl"),
    );
    // A run directory: one checkpoint per save, `latest` naming the newest.
    assert_eq!(
        std::fs::read_to_string(ckpt.join("latest")).unwrap().trim(),
        "step-000004"
    );
    for step in ["step-000002", "step-000004"] {
        for f in [
            "checkpoint.json",
            "model.safetensors",
            "optimizer.safetensors",
        ] {
            assert!(ckpt.join(step).join(f).is_file(), "{step}/{f} missing");
        }
    }
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(ckpt.join("step-000004").join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["step"], 4);
    train(
        &["--steps", "6", "-s", "1f1b", "-p", "4", "--resume", c],
        &d.join("b.jsonl"),
    );
    let full = losses(&d.join("full.jsonl"));
    let resumed = losses(&d.join("b.jsonl"));
    assert_eq!(
        resumed,
        full[4..],
        "resumed losses differ from the uninterrupted run"
    );

    // Mismatches name the problem and the fix.
    let e = fails(&[
        "train", "--model", "micro", "--layers", "2", "-m", "4", "--steps", "6", "--resume", c,
    ]);
    assert!(
        e.contains("layers 2 (checkpoint: 4)") && e.contains("--layers 4"),
        "{e}"
    );
    let mut args = vec!["train", "--steps", "4", "--resume", c];
    args.extend(MODEL);
    let e = fails(&args);
    assert!(
        e.contains("already at step 4") && e.contains("raise --steps"),
        "{e}"
    );
    let e = fails(&micro_train("2", &["--save-every", "1"]));
    assert!(e.contains("need --save DIR"), "{e}");

    // Other text is allowed (fine-tuning), with a warning that this is no continuation.
    let text = d.join("other.txt");
    std::fs::write(&text, "abc".repeat(2000)).unwrap();
    let mut args = vec!["train", "--steps", "5", "--resume", c, "--data"];
    args.push(text.to_str().unwrap());
    args.extend(MODEL);
    let out = nobubble(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: --resume: the training text"),
        "{err}"
    );

    // Sampling: the prompt comes back first; a fixed seed gives fixed text.
    let s = |seed: &str| {
        ok(&[
            "sample",
            "--checkpoint",
            c,
            "--prompt",
            "And God said",
            "--tokens",
            "30",
            "--seed",
            seed,
        ])
    };
    let (a, b) = (s("5"), s("5"));
    assert_eq!(a, b);
    assert!(a.starts_with("And God said"), "{a}");
    let greedy = ok(&[
        "sample",
        "--checkpoint",
        c,
        "--prompt",
        "x",
        "--tokens",
        "5",
        "--temperature",
        "0",
    ]);
    assert!(greedy.starts_with('x') && greedy.len() >= 2, "{greedy}");
    let e = fails(&[
        "sample",
        "--checkpoint",
        d.to_str().unwrap(),
        "--prompt",
        "x",
    ]);
    assert!(e.contains("holds no checkpoint"), "{e}");
    // A step directory loads directly, the older one too.
    let old = ckpt.join("step-000002");
    assert!(ok(&[
        "sample",
        "--checkpoint",
        old.to_str().unwrap(),
        "--prompt",
        "x",
        "--tokens",
        "3"
    ])
    .starts_with('x'));
    let e = fails(&["sample", "--checkpoint", c, "--prompt", ""]);
    assert!(e.contains("--prompt must not be empty"), "{e}");
    let e = fails(&[
        "sample",
        "--checkpoint",
        c,
        "--prompt",
        "x",
        "--temperature",
        "-1",
    ]);
    assert!(
        e.contains("--temperature must be 0 (greedy) or positive"),
        "{e}"
    );
    let e = fails(&[
        "sample",
        "--checkpoint",
        c,
        "--prompt",
        "x",
        "--top-p",
        "1.5",
    ]);
    assert!(e.contains("--top-p must be in (0, 1]"), "{e}");
    // Top-k 1 is greedy, whatever the temperature and seed.
    let greedy = |extra: &[&str]| {
        let mut a = vec![
            "sample",
            "--checkpoint",
            c,
            "--prompt",
            "In the",
            "--tokens",
            "12",
        ];
        a.extend(extra);
        ok(&a)
    };
    assert_eq!(
        greedy(&["--temperature", "0"]),
        greedy(&["--top-k", "1", "--temperature", "1.5", "--seed", "9"])
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_checkpoint_that_gives_non_finite_logits_is_an_error_in_score_and_sample() {
    // One update at an absurd learning rate: a finite loss was trained on, so the step is
    // saved, but its weights overflow every logit.
    let d = std::env::temp_dir().join(format!("nobubble-ckpt-nan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let save = d.join("run");
    ok(&micro_train(
        "1",
        &["--lr", "1e30", "--save", save.to_str().unwrap()],
    ));
    let ckpt = save.to_str().unwrap();
    let err = fails(&["score", "--checkpoint", ckpt, "--text", "hello there"]);
    assert!(err.contains("non-finite logits"), "{err}");
    let err = fails(&[
        "sample",
        "--checkpoint",
        ckpt,
        "--prompt",
        "hi",
        "--tokens",
        "3",
    ]);
    assert!(err.contains("non-finite logits"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn keep_last_never_deletes_the_last_checkpoint_a_step_trained_on_to_a_finite_loss() {
    let d = std::env::temp_dir().join(format!("nobubble-keep-good-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let run = d.join("run");
    let r = run.to_str().unwrap();
    ok(&micro_train("5", &["--save", r]));
    // Step 6 trains on step 5's weights to a finite loss, and its absurd update is saved
    // (finite, but every logit overflows); step 7's loss is NaN and the run stops.
    let args = [
        "--resume",
        r,
        "--save",
        r,
        "--save-every",
        "1",
        "--keep-last",
        "1",
        "--lr",
        "1e30",
    ];
    let err = fails(&micro_train("10", &args));
    assert!(err.contains("not saving step 7"), "{err}");
    let names: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["step-000005", "step-000006"]);
    // The good one still samples.
    let good = run.join("step-000005");
    ok(&[
        "sample",
        "--checkpoint",
        good.to_str().unwrap(),
        "--prompt",
        "a",
        "--tokens",
        "2",
    ]);
    let _ = std::fs::remove_dir_all(&d);
}
