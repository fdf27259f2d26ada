//! Checkpoints never cost a user anything: `--save` deletes only what a checkpoint's own
//! files prove nobubble wrote, refuses symlinks and other models' checkpoints, and a load
//! refuses damaged, non-finite or edited state; a diverged run exits non-zero.

mod common;
use common::{fails, ok};
use std::path::{Path, PathBuf};

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
    // A directory that merely contains a file named checkpoint.json, and the user's data.
    let fake = d.join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("checkpoint.json"), "{}").unwrap();
    std::fs::write(fake.join("data.txt"), "important").unwrap();
    let e = run_fails(&["--save", s(&fake)]);
    assert!(e.contains("data.txt") && e.contains("never deletes"), "{e}");
    assert_eq!(
        std::fs::read_to_string(fake.join("data.txt")).unwrap(),
        "important"
    );
    // Another tool's model directory (it writes model.safetensors too): refused, kept.
    let hf = d.join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("model.safetensors"), "their weights").unwrap();
    let e = run_fails(&["--save", s(&hf)]);
    assert!(e.contains("no checkpoint.json"), "{e}");
    assert_eq!(
        std::fs::read_to_string(hf.join("model.safetensors")).unwrap(),
        "their weights"
    );
    // A real checkpoint with the user's notes in it: refused, notes kept.
    let real = d.join("real");
    run_ok(&["--save", s(&real)]);
    std::fs::write(real.join("notes.md"), "my notes").unwrap();
    let e = run_fails(&["--steps", "3", "--resume", s(&real), "--save", s(&real)]);
    assert!(e.contains("notes.md"), "{e}");
    assert_eq!(
        std::fs::read_to_string(real.join("notes.md")).unwrap(),
        "my notes"
    );
    std::fs::remove_file(real.join("notes.md")).unwrap();
    // A leftover staging directory holding something of the user's: refused, kept.
    let staging = d.join(".real.tmp");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("plot.png"), "png").unwrap();
    let e = run_fails(&["--save", s(&real)]);
    assert!(e.contains(".real.tmp") && e.contains("plot.png"), "{e}");
    assert!(staging.join("plot.png").is_file());
    std::fs::remove_dir_all(&staging).unwrap();
    // A symlink to a checkpoint: refused, the link stays a link.
    let link = d.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = run_fails(&["--save", s(&link)]);
    assert!(e.contains("symlink"), "{e}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // Another model's checkpoint: refused unless --overwrite.
    let e = run_fails(&["--hidden", "64", "--save", s(&real)]);
    assert!(
        e.contains("another model") && e.contains("--overwrite"),
        "{e}"
    );
    run_ok(&["--hidden", "64", "--save", s(&real), "--overwrite"]);
    // Saving over our own checkpoint of the same model is fine, and leaves only its files.
    run_ok(&["--hidden", "64", "--save", s(&real)]);
    let mut names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["fake", "hf", "link", "real"]);
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
    let base = d.join("base");
    run_ok(&["--save", s(&base)]);
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
}
