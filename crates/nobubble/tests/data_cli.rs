//! `train --data` in each format, `--train-tokenizer` and `--tokenizer`, and what a checkpoint
//! of a tokenized run carries into `resume`, `sample`, `score` and `export`.

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::{fails, nobubble, ok};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Verses of the built-in excerpt, as documents.
fn verses(n: usize) -> Vec<String> {
    let text = std::str::from_utf8(&nobubble_nn::data::BUILTIN_CORPUS[..400_000]).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(str::to_string)
        .collect()
}

/// `train` on the micro model for `steps` steps; returns stderr.
fn train(steps: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "train",
        "--model",
        "micro",
        "--steps",
        steps,
        "--eval-sets",
        "1",
    ];
    args.extend(extra);
    let out = nobubble(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {stderr}");
    stderr
}

fn meta(run: &Path) -> Value {
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    let path = run.join(latest.trim()).join("checkpoint.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn text_files_directories_and_json_lines_train() {
    let d = dir("formats");
    let docs = verses(3000);
    let jsonl: String = docs
        .iter()
        .map(|v| serde_json::json!({ "text": v, "source": "kjv" }).to_string() + "\n")
        .collect();
    std::fs::write(d.join("verses.jsonl"), &jsonl).unwrap();
    std::fs::create_dir(d.join("books")).unwrap();
    for (i, chunk) in docs.chunks(1000).enumerate() {
        std::fs::write(d.join("books").join(format!("{i}.txt")), chunk.join("\n")).unwrap();
    }
    std::fs::write(d.join("all.txt"), docs.join("\n")).unwrap();

    let text = train("2", &["--data", s(&d.join("all.txt"))]);
    assert!(
        text.contains("(text), bytes:") && text.contains("vocabulary 256"),
        "{text}"
    );
    let lines = train("2", &["--data", s(&d.join("verses.jsonl"))]);
    let n = docs.len();
    assert!(n > 2000);
    let documents = format!("{n} documents");
    assert!(
        lines.contains("(JSON lines)") && lines.contains(&documents),
        "{lines}"
    );
    assert!(
        lines.contains("vocabulary 257"),
        "bytes + end-of-text: {lines}"
    );
    let books = train("2", &["--data", s(&d.join("books"))]);
    let files = format!("{} documents", n.div_ceil(1000));
    assert!(
        books.contains("(directory)") && books.contains(&files),
        "{books}"
    );

    // A malformed line anywhere: a clear error naming it, and nothing trained or saved.
    let mut broken = jsonl.clone();
    let line = 1234;
    let offset = broken.match_indices('\n').nth(line - 2).unwrap().0 + 1;
    broken.insert_str(offset, "{\"text\": \"unterminated\n");
    std::fs::write(d.join("broken.jsonl"), broken).unwrap();
    let run = d.join("never");
    let err = fails(&[
        "train",
        "--model",
        "micro",
        "--steps",
        "2",
        "--data",
        s(&d.join("broken.jsonl")),
        "--save",
        s(&run),
    ]);
    assert!(
        err.contains(&format!("broken.jsonl:{line}")) && err.contains("not valid JSON"),
        "{err}"
    );
    assert!(!err.contains("step "), "trained on garbage: {err}");
    assert!(!run.exists());
    std::fs::write(d.join("notext.jsonl"), "{\"content\": \"x\"}\n").unwrap();
    let err = fails(&[
        "train",
        "--model",
        "micro",
        "--data",
        s(&d.join("notext.jsonl")),
    ]);
    assert!(
        err.contains("notext.jsonl:1") && err.contains("\"text\""),
        "{err}"
    );
    let err = fails(&[
        "train",
        "--model",
        "micro",
        "--data",
        s(&d.join("missing.txt")),
    ]);
    assert!(err.contains("no such file"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_trained_tokenizer_travels_with_its_checkpoints() {
    let d = dir("tokenizer");
    let (run, hf) = (d.join("run"), d.join("hf"));
    let log = d.join("a.jsonl");
    let out = train(
        "4",
        &[
            "--arch",
            "llama",
            "--train-tokenizer",
            "600",
            "--save",
            s(&run),
            "--log",
            s(&log),
        ],
    );
    assert!(
        out.contains("byte-level BPE of 600 ids") && out.contains("vocabulary 600"),
        "{out}"
    );
    let m = meta(&run);
    assert_eq!(m["model"]["vocab"], 600);
    let tokenizer = m["tokenizer"]
        .as_str()
        .expect("the checkpoint holds the tokenizer");
    let tokenizer: Value = serde_json::from_str(tokenizer).unwrap();
    assert_eq!(tokenizer["model"]["type"], "BPE");

    // Resume keeps the tokenizer (and refuses to train another one).
    train(
        "6",
        &["--arch", "llama", "--resume", s(&run), "--save", s(&run)],
    );
    assert_eq!(meta(&run)["step"], 6);
    assert_eq!(meta(&run)["tokenizer"], m["tokenizer"]);
    let err = fails(&[
        "train",
        "--model",
        "micro",
        "--arch",
        "llama",
        "--resume",
        s(&run),
        "--steps",
        "8",
        "--train-tokenizer",
        "600",
    ]);
    assert!(err.contains("keeps its checkpoint's tokenizer"), "{err}");

    // Sampling decodes text; scoring tokenizes it; the export carries tokenizer.json.
    let text = ok(&[
        "sample",
        "--checkpoint",
        s(&run),
        "--prompt",
        "And God",
        "--tokens",
        "10",
    ]);
    assert!(
        text.starts_with("And God") && text.len() > "And God".len(),
        "{text}"
    );
    let scored: Value = serde_json::from_str(&ok(&[
        "score",
        "--checkpoint",
        s(&run),
        "--text",
        "And God said",
        "--json",
    ]))
    .unwrap();
    assert!(
        scored["tokens"].as_u64().unwrap() < 11,
        "BPE merges: {scored}"
    );
    ok(&["export", s(&run), s(&hf)]);
    assert!(hf.join("tokenizer.json").is_file());
    let again: Value = serde_json::from_str(&ok(&[
        "score",
        "--checkpoint",
        s(&hf),
        "--text",
        "And God said",
        "--json",
    ]))
    .unwrap();
    assert_eq!(scored, again);

    // The exported tokenizer.json as --tokenizer tokenizes alike: same first losses.
    let log2 = d.join("b.jsonl");
    train(
        "4",
        &[
            "--arch",
            "llama",
            "--tokenizer",
            s(&hf.join("tokenizer.json")),
            "--log",
            s(&log2),
        ],
    );
    let first = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    let loss = |l: String| serde_json::from_str::<Value>(&l).unwrap()["loss"].clone();
    assert_eq!(loss(first(&log)), loss(first(&log2)));
    let err = fails(&["train", "--model", "micro", "--train-tokenizer", "100"]);
    assert!(err.contains("more than 257"), "{err}");
    std::fs::write(d.join("bad.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    let err = fails(&[
        "train",
        "--model",
        "micro",
        "--tokenizer",
        s(&d.join("bad.json")),
    ]);
    assert!(
        err.contains("bad.json") && err.contains("tokenizer"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
