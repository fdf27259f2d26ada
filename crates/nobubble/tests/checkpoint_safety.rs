//! Checkpoints never cost a user anything: `--save` deletes only what a checkpoint's own
//! files prove nobubble wrote, refuses symlinks and other models' checkpoints, and a load
//! refuses damaged, non-finite or edited state; a diverged run exits non-zero.

mod common;
use common::{fails, ok};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-safety-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn train(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--model", "micro", "-m", "2", "--eval-sets", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    if !extra.contains(&"--steps") {
        a.extend(["--steps".to_string(), "2".to_string()]);
    }
    a
}

fn run_ok(extra: &[&str]) {
    let a = train(extra);
    ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
}

fn run_fails(extra: &[&str]) -> String {
    let a = train(extra);
    fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn save_never_deletes_what_it_did_not_write() {
    let d = dir("save");
    // A directory that merely contains a file named checkpoint.json, and the user's data:
    // the single-checkpoint layout is refused as a run directory, nothing touched.
    let fake = d.join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("checkpoint.json"), "{}").unwrap();
    std::fs::write(fake.join("data.txt"), "important").unwrap();
    let e = run_fails(&["--save", s(&fake)]);
    assert!(e.contains("not a run directory"), "{e}");
    assert_eq!(
        std::fs::read_to_string(fake.join("data.txt")).unwrap(),
        "important"
    );
    // Another tool's model directory: the run's checkpoints go beside its files, which stay.
    let hf = d.join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("model.safetensors"), "their weights").unwrap();
    run_ok(&["--save", s(&hf)]);
    assert_eq!(
        std::fs::read_to_string(hf.join("model.safetensors")).unwrap(),
        "their weights"
    );
    assert!(hf.join("step-000002").join("checkpoint.json").is_file());
    // A run directory with the user's notes: kept through saves and --keep-last.
    let run = d.join("run");
    run_ok(&["--save", s(&run)]);
    std::fs::write(run.join("notes.md"), "my notes").unwrap();
    // A step directory the user put a plot into is not removed by --keep-last.
    std::fs::write(run.join("step-000002").join("plot.png"), "png").unwrap();
    run_ok(&[
        "--steps",
        "4",
        "--save-every",
        "1",
        "--keep-last",
        "1",
        "--resume",
        s(&run),
        "--save",
        s(&run),
    ]);
    assert_eq!(
        std::fs::read_to_string(run.join("notes.md")).unwrap(),
        "my notes"
    );
    assert!(run.join("step-000002").join("plot.png").is_file());
    let mut steps: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    steps.sort();
    // Step 2 holds the user's plot; step 3, which step 4 trained on to a finite loss, is the
    // last checkpoint known good (--keep-last spares it).
    assert_eq!(
        steps,
        [
            "latest",
            "notes.md",
            "step-000002",
            "step-000003",
            "step-000004"
        ]
    );
    // A leftover staging directory holding something of the user's: refused, kept.
    let staging = run.join(".step-000006.tmp");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("mine.txt"), "mine").unwrap();
    let e = run_fails(&["--steps", "6", "--resume", s(&run), "--save", s(&run)]);
    assert!(
        e.contains(".step-000006.tmp") && e.contains("mine.txt"),
        "{e}"
    );
    assert!(staging.join("mine.txt").is_file());
    std::fs::remove_dir_all(&staging).unwrap();
    // A symlinked run directory: written through, the link stays a link.
    let link = d.join("link");
    std::os::unix::fs::symlink(&run, &link).unwrap();
    run_ok(&["--steps", "5", "--resume", s(&link), "--save", s(&link)]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(run.join("step-000005").is_dir());
    // Another model's run: refused unless --overwrite.
    let e = run_fails(&["--hidden", "64", "--save", s(&run)]);
    assert!(
        e.contains("another model") && e.contains("--overwrite"),
        "{e}"
    );
    // A save that would replace the step directory holding the plot: refused before
    // training, naming it.
    let e = run_fails(&["--hidden", "64", "--save", s(&run), "--overwrite"]);
    assert!(e.contains("step-000002") && e.contains("plot.png"), "{e}");
    assert!(
        !e.contains("step    1/"),
        "refused only after training: {e}"
    );
    std::fs::remove_file(run.join("step-000002").join("plot.png")).unwrap();
    run_ok(&["--hidden", "64", "--save", s(&run), "--overwrite"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// Flips bytes in the middle of `file`.
fn damage(file: &Path) {
    let mut b = std::fs::read(file).unwrap();
    let mid = b.len() / 2;
    for x in &mut b[mid..mid + 64] {
        *x ^= 0x5a;
    }
    std::fs::write(file, b).unwrap();
}

#[test]
fn damaged_non_finite_or_edited_checkpoints_are_refused_on_resume() {
    let d = dir("load");
    let run = d.join("base");
    run_ok(&["--save", s(&run)]);
    let base = run.join("step-000002");
    let copy = |name: &str| {
        let to = d.join(name);
        std::fs::create_dir(&to).unwrap();
        for f in [
            "checkpoint.json",
            "model.safetensors",
            "optimizer.safetensors",
        ] {
            std::fs::copy(base.join(f), to.join(f)).unwrap();
        }
        to
    };
    // Flipped bytes in the weights: the checksum names the file.
    let flipped = copy("flipped");
    damage(&flipped.join("model.safetensors"));
    let e = run_fails(&["--steps", "3", "--resume", s(&flipped)]);
    assert!(
        e.contains("model.safetensors") && e.contains("SHA-256"),
        "{e}"
    );
    let e = fails(&["sample", "--checkpoint", s(&flipped), "--prompt", "In"]);
    assert!(e.contains("SHA-256"), "{e}");
    // A NaN weight (checksums rewritten to match, as an editor could): refused, named.
    let nan = copy("nan");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(nan.join("checkpoint.json")).unwrap()).unwrap();
    meta.as_object_mut().unwrap().remove("files");
    std::fs::write(nan.join("checkpoint.json"), meta.to_string()).unwrap();
    let mut w = std::fs::read(nan.join("model.safetensors")).unwrap();
    let at = w.len() - 4;
    w[at..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(nan.join("model.safetensors"), w).unwrap();
    let e = run_fails(&["--steps", "3", "--resume", s(&nan)]);
    assert!(e.contains("NaN") && e.contains("model.safetensors"), "{e}");
    // Edited optimizer settings: out of range is refused; a step count that disagrees too.
    for (field, value) in [("beta2", "2.0"), ("lr", "-1.0")] {
        let edited = copy(&format!("edit-{field}"));
        let p = edited.join("checkpoint.json");
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        meta["optimizer_config"][field] = serde_json::from_str(value).unwrap();
        std::fs::write(&p, meta.to_string()).unwrap();
        let e = run_fails(&["--steps", "3", "--resume", s(&edited)]);
        assert!(e.contains(&format!("`{field}` is out of range")), "{e}");
    }
    let steps = copy("edit-steps");
    let p = steps.join("checkpoint.json");
    let mut meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    meta["optimizer_steps"] = 99.into();
    std::fs::write(&p, meta.to_string()).unwrap();
    let e = run_fails(&["--steps", "3", "--resume", s(&steps)]);
    assert!(e.contains("took 99 steps"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_diverged_run_exits_non_zero() {
    let e = run_fails(&["--lr", "1e30", "--steps", "4"]);
    assert!(e.contains("diverged"), "{e}");
    // With --save, the good checkpoint stays the latest: the diverged state is not saved.
    let d = dir("diverged");
    let run = d.join("run");
    run_ok(&["--save", s(&run)]);
    let e = run_fails(&[
        "--lr",
        "1e30",
        "--steps",
        "6",
        "--resume",
        s(&run),
        "--save",
        s(&run),
    ]);
    assert!(
        e.contains("not saving step 6") && e.contains("diverged"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("latest")).unwrap().trim(),
        "step-000002"
    );
    assert!(!run.join("step-000006").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_run_directory_is_never_rewound_or_its_pointer_replaced_unasked() {
    let d = dir("rewind");
    let run = d.join("run");
    run_ok(&["--steps", "4", "--save-every", "1", "--save", s(&run)]);
    // Resuming from an earlier step into the same run would replace steps 3 and 4.
    let two = run.join("step-000002");
    let e = run_fails(&["--steps", "3", "--resume", s(&two), "--save", s(&run)]);
    assert!(
        e.contains("step-000003") && e.contains("--overwrite"),
        "{e}"
    );
    // With --overwrite and --keep-last 1: step 3 is rewritten, the newer step 4 is not
    // removed (it is not older), step 1 is; step 2, which step 3 trained on to a finite
    // loss, is the last checkpoint known good and stays until a newer one is.
    run_ok(&[
        "--steps",
        "3",
        "--resume",
        s(&two),
        "--save",
        s(&run),
        "--overwrite",
        "--keep-last",
        "1",
    ]);
    let mut names: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["latest", "step-000002", "step-000003", "step-000004"]
    );
    // The new step 3 is the latest: the old run's step 4 does not follow it, so resuming
    // the run starts at step 3 and would replace step 4.
    let e = run_fails(&["--steps", "4", "--resume", s(&run), "--save", s(&run)]);
    assert!(
        e.contains("step-000004") && e.contains("--overwrite"),
        "{e}"
    );
    // A `latest` that is the user's symlink: refused before training, the link kept.
    let other = d.join("other");
    run_ok(&["--save", s(&other)]);
    std::fs::remove_file(other.join("latest")).unwrap();
    std::os::unix::fs::symlink("step-000002", other.join("latest")).unwrap();
    let e = run_fails(&["--steps", "3", "--save", s(&other)]);
    assert!(e.contains("latest") && e.contains("symlink"), "{e}");
    assert!(std::fs::symlink_metadata(other.join("latest"))
        .unwrap()
        .file_type()
        .is_symlink());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_save_killed_before_latest_moved_is_resumed_from() {
    let d = dir("lagging-latest");
    let run = d.join("run");
    run_ok(&["--steps", "3", "--save-every", "1", "--save", s(&run)]);
    // Two saves killed after their step directory was in place, before `latest` moved.
    std::fs::write(run.join("latest"), "step-000001\n").unwrap();
    let args = train(&[
        "--steps",
        "5",
        "--save-every",
        "1",
        "--resume",
        s(&run),
        "--save",
        s(&run),
    ]);
    let out = common::nobubble(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("resumed from")
            && l.ends_with("at step 3 (saved from zb-auto on 2 ranks, 2 stages)")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("latest")).unwrap(),
        "step-000005\n"
    );
    // A step directory that does not follow `latest` (another run's) is not taken for one.
    std::fs::write(run.join("latest"), "step-000004\n").unwrap();
    let meta = run.join("step-000005").join("checkpoint.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    let i = text.find("\"follows\": \"").unwrap() + 12;
    let flipped = if &text[i..i + 1] == "0" { "1" } else { "0" };
    std::fs::write(&meta, format!("{}{flipped}{}", &text[..i], &text[i + 1..])).unwrap();
    let e = run_fails(&["--steps", "5", "--resume", s(&run), "--save", s(&run)]);
    assert!(
        e.contains("step-000005") && e.contains("--overwrite"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_fresh_run_does_not_mix_with_another_runs_checkpoints() {
    let d = dir("mix");
    let run = d.join("run");
    run_ok(&["--steps", "4", "--save-every", "2", "--save", s(&run)]);
    // Forgot --resume: refused before training, naming the newest checkpoint; nothing moves.
    let e = run_fails(&["--steps", "6", "--save", s(&run), "--keep-last", "1"]);
    assert!(
        e.contains("holds another run's checkpoints (2 of them, the newest step-000004)")
            && e.contains("--resume"),
        "{e}"
    );
    let latest = || std::fs::read_to_string(run.join("latest")).unwrap();
    assert_eq!(latest().trim(), "step-000004");
    assert!(run.join("step-000002").is_dir());
    // Continuing it is fine; so is saving there anyway when asked (the older steps stay).
    run_ok(&["--steps", "5", "--resume", s(&run), "--save", s(&run)]);
    assert_eq!(latest().trim(), "step-000005");
    run_ok(&["--steps", "6", "--save", s(&run), "--overwrite"]);
    assert_eq!(latest().trim(), "step-000006");
    // A pointer to a step that is gone, or no pointer: the error names the newest left.
    let sample = || {
        fails(&[
            "sample",
            "--checkpoint",
            s(&run),
            "--prompt",
            "a",
            "--tokens",
            "2",
        ])
    };
    std::fs::remove_dir_all(run.join("step-000006")).unwrap();
    let e = sample();
    assert!(
        e.contains("the newest checkpoint left is step-000005"),
        "{e}"
    );
    std::fs::remove_file(run.join("latest")).unwrap();
    let e = sample();
    assert!(
        e.contains("has no `latest` pointer") && e.contains("step-000005"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn two_runs_never_save_into_one_directory_at_once() {
    let d = dir("lock");
    let run = d.join("run");
    std::fs::create_dir_all(&run).unwrap();
    // A run still going (this test's own process stands for it) holds the lock.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let lock = run.join(".lock");
    std::fs::write(&lock, format!("{} {}\n", std::process::id(), host.trim())).unwrap();
    let e = run_fails(&["--save", s(&run), "--overwrite"]);
    assert!(
        e.contains(&format!("another run (process {}", std::process::id()))
            && e.contains("overwrite each other's checkpoints"),
        "{e}"
    );
    assert!(!run.join("latest").exists(), "nothing was saved");
    // A lock left by a run that is gone is taken over, and removed when this run ends.
    std::fs::write(&lock, format!("4294967295 {}\n", host.trim())).unwrap();
    run_ok(&["--save", s(&run)]);
    assert!(run.join("step-000002").is_dir() && !lock.exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_resumed_run_continues_its_log() {
    let d = dir("log");
    let (run, log) = (d.join("run"), d.join("steps.jsonl"));
    run_ok(&["--steps", "3", "--save", s(&run), "--log", s(&log)]);
    run_ok(&[
        "--steps",
        "5",
        "--resume",
        s(&run),
        "--save",
        s(&run),
        "--log",
        s(&log),
    ]);
    let steps: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    // Numbered as the console and the checkpoints number them: step-000003 is line 3.
    assert_eq!(steps, [1, 2, 3, 4, 5]);
    // A fresh run starts the file anew.
    run_ok(&["--steps", "2", "--log", s(&log)]);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_resume_of_another_model_names_every_flag_that_differs() {
    let d = dir("flags");
    let run = d.join("run");
    run_ok(&["--arch", "llama", "--save", s(&run)]);
    let e = run_fails(&["--steps", "3", "--resume", s(&run)]);
    assert!(
        e.contains("--arch llama") && e.contains("--kv-heads 1"),
        "{e}"
    );
    // The flags it names resume it.
    run_ok(&[
        "--steps",
        "3",
        "--resume",
        s(&run),
        "--arch",
        "llama",
        "--kv-heads",
        "1",
    ]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn running_a_model_needs_only_its_weights() {
    let d = dir("weights");
    let run = d.join("run");
    run_ok(&["--save", s(&run)]);
    std::fs::remove_file(run.join("step-000002").join("optimizer.safetensors")).unwrap();
    ok(&[
        "sample",
        "--checkpoint",
        s(&run),
        "--prompt",
        "In the",
        "--tokens",
        "3",
    ]);
    // Training on needs the moments: refused, naming the file.
    let e = run_fails(&["--steps", "3", "--resume", s(&run)]);
    assert!(e.contains("optimizer.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

// In this binary rather than beside the random kills of `kill_during_save.rs`: running
// beside them, it slowed their start-up until no kill landed in a save.
/// `cmd` with its files limited to `bytes` each (a full disk, as a write sees it: the write
/// fails, with SIGXFSZ ignored, as EFBIG).
fn with_file_limit(cmd: &mut Command, bytes: u64) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

#[test]
fn a_save_that_cannot_be_written_leaves_no_partial_files() {
    let d = std::env::temp_dir().join(format!("nobubble-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let (run, trace) = (d.join("run"), d.join("t.json"));
    let base = ["train", "--model", "micro", "--save-every", "1", "--save"];
    let r = run.to_str().unwrap();
    ok(&[&base[..], &[r, "--steps", "1"]].concat());
    // The micro model's weights fit in 250 kB, its AdamW moments (twice as many) do not.
    let out = with_file_limit(
        Command::new(env!("CARGO_BIN_EXE_nobubble"))
            .args(base)
            .args([r, "--steps", "2", "--resume", r])
            .args(["--trace", trace.to_str().unwrap()])
            .stdout(Stdio::null()),
        250_000,
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("optimizer.safetensors"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .chain(std::fs::read_dir(&d).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    left.sort();
    assert!(left.is_empty(), "partial files left: {left:?}");
    // The last good checkpoint is still the latest, and resumes.
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    assert_eq!(latest.trim(), "step-000001");
    ok(&[
        &base[..],
        &[run.to_str().unwrap(), "--resume", run.to_str().unwrap()],
    ]
    .concat());
    let _ = std::fs::remove_dir_all(&d);
}
