//! Hugging Face interchange as a user runs it: `export --format hf`, `train --init-from`,
//! `score` on both kinds of directory, and the errors of each. (transformers itself loads
//! the exported directory in the Python tests.)

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::{fails, ok};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-hf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn report(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const LLAMA: [&str; 10] = [
    "--model",
    "micro",
    "--arch",
    "llama",
    "--layers",
    "4",
    "-m",
    "4",
    "--eval-sets",
    "1",
];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn an_exported_model_scores_and_trains_on_exactly_where_the_checkpoint_left_off() {
    let d = dir("round-trip");
    let (run, hf, out) = (d.join("run"), d.join("hf"), d.join("a.json"));
    let mut args = vec![
        "train",
        "--steps",
        "6",
        "--save",
        s(&run),
        "--report",
        s(&out),
    ];
    args.extend(LLAMA);
    ok(&args);
    let after = report(&out)["loss"]["validation_after"].as_f64().unwrap();

    let listed = ok(&["export", s(&run), s(&hf), "--format", "hf"]);
    assert!(listed.contains("config.json") && listed.contains("model.safetensors"));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["num_key_value_heads"], 1);
    assert_eq!(config["num_hidden_layers"], 4);

    // The same text scores the same under the checkpoint and under its export.
    let text = "And the evening and the morning were";
    let score = |model: &Path| -> Value {
        let out = ok(&["score", "--checkpoint", s(model), "--text", text, "--json"]);
        serde_json::from_str(&out).unwrap()
    };
    let (a, b) = (score(&run), score(&hf));
    assert_eq!(a, b);
    assert_eq!(a["tokens"], text.len() - 1);
    // Any window longer than the text scores the same, and a huge one costs no memory (the
    // model is built no longer than the text); one whose attention cannot fit is an error up
    // front.
    let window = |n: &str| -> Value {
        let args = [
            "score",
            "--checkpoint",
            s(&hf),
            "--text",
            text,
            "--json",
            "--seq-len",
            n,
        ];
        serde_json::from_str(&ok(&args)).unwrap()
    };
    assert_eq!(window("100000000000"), window("64"));
    let tight = std::process::Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(["score", "--checkpoint", s(&hf), "--text", text])
        .env("NOBUBBLE_MEM_AVAILABLE", "1000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&tight.stderr);
    assert_eq!(tight.status.code(), Some(1), "{err}");
    assert!(
        err.contains("attention over a window of") && err.contains("use a smaller --seq-len"),
        "{err}"
    );
    let err = fails(&[
        "score",
        "--checkpoint",
        s(&hf),
        "--text",
        text,
        "--seq-len",
        "0",
    ]);
    assert!(err.contains("--seq-len must be at least 1"), "{err}");

    // Fine-tuning from the export starts from the trained weights: its validation loss before
    // training is the first run's after, to the bit (same held-out sets).
    let out2 = d.join("b.json");
    ok(&[
        "train",
        "--init-from",
        s(&hf),
        "--seq-len",
        "16",
        "--microbatch-size",
        "2",
        "--steps",
        "1",
        "-m",
        "4",
        "--eval-sets",
        "1",
        "--report",
        s(&out2),
    ]);
    let before = report(&out2)["loss"]["validation_before"].as_f64().unwrap();
    assert_eq!(before, after);

    // Exporting again needs --overwrite; a directory with other files is never touched.
    let err = fails(&["export", s(&run), s(&hf)]);
    assert!(err.contains("--overwrite"), "{err}");
    // A leftover of an interrupted export is no obstacle.
    std::fs::write(hf.join(".model.safetensors.partial"), "cut off").unwrap();
    ok(&["export", s(&run), s(&hf), "--overwrite"]);
    std::fs::write(d.join("notes.txt"), "mine").unwrap();
    let err = fails(&["export", s(&run), s(&d), "--overwrite"]);
    assert!(err.contains("new or empty directory"), "{err}");
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "mine"
    );
    // A file where the directory goes: named as such, and kept.
    let err = fails(&["export", s(&run), s(&d.join("notes.txt"))]);
    assert!(
        err.contains("is a file; the export writes a directory"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "mine"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn what_cannot_be_exported_or_initialized_from_is_refused_naming_the_problem() {
    let d = dir("errors");
    let gpt = d.join("gpt");
    ok(&[
        "train",
        "--model",
        "micro",
        "--steps",
        "1",
        "--save",
        s(&gpt),
    ]);
    let err = fails(&["export", s(&gpt), s(&d.join("out"))]);
    assert!(err.contains("--arch llama"), "{err}");
    assert!(
        !d.join("out").exists(),
        "nothing written for a refused export"
    );

    let llama = d.join("llama");
    let mut args = vec!["train", "--steps", "1", "--save", s(&llama)];
    args.extend(LLAMA);
    ok(&args);
    let hf = d.join("hf");
    ok(&["export", s(&llama), s(&hf)]);
    let train_from = |extra: &[&str]| {
        let mut a = vec!["train", "--init-from", s(&hf), "--steps", "1"];
        a.extend(extra);
        fails(&a)
    };
    let err = train_from(&["--hidden", "64"]);
    assert!(err.contains("drop --hidden"), "{err}");
    let err = train_from(&["--resume", s(&llama)]);
    assert!(err.contains("--resume"), "{err}");
    // A run saved into the export would make one directory two models.
    let err = train_from(&["--save", s(&hf)]);
    assert!(err.contains("is a Hugging Face model directory"), "{err}");
    assert!(!hf.join("latest").exists());

    // A config.json that asks for what the blocks do not compute names the field.
    let path = hf.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["attention_bias"] = Value::Bool(true);
    std::fs::write(&path, config.to_string()).unwrap();
    let err = train_from(&[]);
    assert!(err.contains("attention_bias"), "{err}");
    let err = fails(&["score", "--checkpoint", s(&hf), "--text", "abc"]);
    assert!(err.contains("attention_bias"), "{err}");
    std::fs::write(&path, "{ not json").unwrap();
    let err = train_from(&[]);
    assert!(
        err.contains("config.json") && err.contains("not JSON"),
        "{err}"
    );
    std::fs::remove_file(&path).unwrap();
    let err = train_from(&[]);
    assert!(err.contains("config.json"), "{err}");

    let err = fails(&["score", "--checkpoint", s(&llama), "--text", "a"]);
    assert!(err.contains("at least 2 tokens"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
