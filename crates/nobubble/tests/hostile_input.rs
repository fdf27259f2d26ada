//! Bad input gets a clear error naming the problem — never an abort, a panic or a silently
//! wrong answer: oversized CSV indices, byte-order marks, negative numbers, unknown JSON
//! fields, missing passes, and memory predictions when a stage holds more after I than F.

mod common;
use common::{fails, ok, words};
use std::path::PathBuf;
use std::process::Command;

fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn a_small_csv_asking_for_huge_tables_is_refused_cheaply() {
    // 12.9 KB naming 2000 stages and microbatch 1048575: 2·10⁹ table cells if believed.
    let mut text: Vec<String> = (0..2000).map(|s| format!("{s}F0")).collect();
    text.push("0F1048575".into());
    let p = file("big.csv", text.join(",").as_bytes());
    // Under a 1 GiB address-space limit: an allocation of the tables would abort.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 1048576; exec {} check {}",
            env!("CARGO_BIN_EXE_nobubble"),
            p.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a cell mistyped"), "{stderr}");
    assert!(!stderr.contains("memory allocation"), "{stderr}");
}

#[test]
fn a_digit_too_many_is_refused_at_once() {
    // Bounds and reports cost ranks × stages: 10⁵ ranks would plan for minutes.
    let e = fails(&["plan", "-p", "100000", "-m", "4"]);
    assert!(
        e.contains("100000 ranks is more than the planner handles (4096)"),
        "{e}"
    );
    let e = fails(&[
        "plan",
        "-s",
        "interleaved",
        "-p",
        "4096",
        "-m",
        "4096",
        "--chunks",
        "5",
    ]);
    assert!(
        e.contains("20480 stages is more than the planner handles (16384)"),
        "{e}"
    );
    // The same for a schedule file: 5000 one-stage ranks.
    let rows: Vec<String> = (0..5000).map(|r| format!("{r}F0,{r}B0")).collect();
    let p = file("wide.csv", rows.join("\n").as_bytes());
    let e = fails(&["check", p.to_str().unwrap()]);
    assert!(
        e.contains("5000 ranks is more than the planner handles"),
        "{e}"
    );
}

/// A plan's JSON report and Chrome trace are written from the schedule one action at a time:
/// as trees of JSON values they took about 2 and 4 KB per action, and a plan within the
/// planner's size limit could not be printed.
#[test]
fn large_plans_export_without_a_tree_of_values() {
    // 307 200 actions: about 0.6 GB each as trees, under 0.1 GB now.
    for format in ["json", "chrome"] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v 524288; exec {} plan -p 512 -m 200 -f {format}",
                env!("CARGO_BIN_EXE_nobubble"),
            ))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "-f {format}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let passes = match format {
            "json" => v["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_array().unwrap().len())
                .sum(),
            _ => v["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == "X")
                .count(),
        };
        assert_eq!(passes, 3 * 512 * 200, "-f {format}");
    }
}

#[test]
fn check_names_a_missing_pass_and_what_train_would_refuse() {
    let p = file("nof.csv", b"0F1,0B0,0B1,0F2,0B2\n");
    let e = fails(&["check", p.to_str().unwrap()]);
    assert!(
        e.contains("its forward 0F0 is missing: no rank runs it"),
        "{e}"
    );
    let p = file("early.csv", b"0B0,0F0,0F1,0B1\n");
    let e = fails(&["check", p.to_str().unwrap()]);
    assert!(e.contains("runs before its forward 0F0"), "{e}");
    // Valid for the simulator, but W out of microbatch order: both facts.
    let p = file("worder.csv", b"0F0,0F1,0I1,0I0,0W1,0W0\n");
    let out = ok(&["check", p.to_str().unwrap()]);
    assert!(out.contains(": valid"), "{out}");
    assert!(
        out.contains("`nobubble train` would refuse it") && out.contains("0W0"),
        "{out}"
    );
}

#[test]
fn byte_order_marks_are_accepted() {
    let p = file("bom.csv", b"\xef\xbb\xbf0F0,0B0\n");
    assert!(ok(&["check", p.to_str().unwrap()]).contains(": valid"));
    let c = file(
        "bom.json",
        b"\xef\xbb\xbf{\"stages\": [{\"f\": 1, \"i\": 1, \"w\": 1}]}",
    );
    ok(&[
        "plan",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "--costs",
        c.to_str().unwrap(),
    ]);
}

#[test]
fn negative_numbers_and_unknown_fields_get_our_messages() {
    let e = fails(&["plan", "-s", "1f1b", "-p", "2", "-m", "2", "--comm", "-1"]);
    assert!(e.contains("comm must be zero, or from"), "{e}");
    let e = fails(&[
        "plan", "-s", "1f1b", "-p", "2", "-m", "2", "--cost", "-1,1,1",
    ]);
    assert!(e.contains("time `f` must be a positive number"), "{e}");
    // A subnormal time (it planned three times worse) is out of range too, shown briefly.
    let e = fails(&words(
        "plan -s zb-auto -p 4 -m 8 --cost 1e-320,1e-320,1e-320",
    ));
    assert!(e.contains("from 1e-15 to 1e15, got 1e-320"), "{e}");
    let e = fails(&[
        "plan",
        "-s",
        "zb-auto",
        "-p",
        "2",
        "-m",
        "2",
        "--mem-limit",
        "-3",
    ]);
    assert!(
        e.contains("--mem-limit") && e.contains("must be a positive number"),
        "{e}"
    );
    let e = fails(&["train", "--compute", "emulated", "--comm", "-1"]);
    assert!(e.contains("--comm must be between 0 and"), "{e}");
    let c = file(
        "typo.json",
        b"{\"stages\": [{\"f\": 1, \"i\": 1, \"w\": 1, \"memb\": 2}]}",
    );
    let e = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "--costs",
        c.to_str().unwrap(),
    ]);
    assert!(e.contains("unknown field `memb`"), "{e}");
}

#[test]
fn compare_fails_when_nothing_fits() {
    let e = fails(&["compare", "-p", "3", "-m", "2", "--mem-limit", "0.5"]);
    assert!(e.contains("no schedule fits within --mem-limit"), "{e}");
}

#[test]
fn the_memory_prediction_holds_when_a_stage_keeps_more_for_w_than_after_f() {
    // h 512 with a 16-byte context: what I keeps for W outweighs what F kept.
    let out = ok(&[
        "train",
        "--model",
        "tiny",
        "--hidden",
        "512",
        "--heads",
        "8",
        "--layers",
        "4",
        "--seq-len",
        "16",
        "--microbatch-size",
        "1",
        "-m",
        "2",
        "--steps",
        "3",
        "--eval-sets",
        "1",
    ]);
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("peak activation"))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    for l in lines {
        // "rank r: peak activation memory X MiB (planner predicted Y MiB)"
        let nums: Vec<&str> = l
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|t| t.contains('.'))
            .collect();
        assert_eq!(nums.len(), 2, "{l}");
        assert_eq!(nums[0], nums[1], "{l}");
    }
}

#[test]
fn flags_that_would_be_ignored_or_misread_are_refused() {
    let costs = file(
        "one.json",
        br#"{"stages": [{"f": 1, "i": 1, "w": 1, "mem_b": 1, "mem_w": 0.5}]}"#,
    );
    let c = costs.to_str().unwrap();
    // --costs beside the flags it replaces: an error, not a silent choice.
    let e = fails(&words(&format!(
        "plan -s zb-h1 -p 4 -m 8 --costs {c} --comm 5"
    )));
    assert!(e.contains("--costs") && e.contains("--comm"), "{e}");
    // --mem given as its default's value is still given: a byte budget reads it.
    let out = ok(&words(
        "plan -s zb-auto -p 4 -m 8 --mem 1,0.5 --mem-limit 8B",
    ));
    assert!(out.contains("within each rank's budget"), "{out}");
    let e = fails(&words("plan -s zb-auto -p 4 -m 8 --mem-limit 8B"));
    assert!(e.contains("needs --mem"), "{e}");
    // An empty limit (an unset shell variable) is not "no limit".
    let mut empty = words("plan -s 1f1b -p 4 -m 8 --mem-limit");
    empty.push("");
    let e = fails(&empty);
    assert!(e.contains("is empty"), "{e}");
    // bench memory sweeps the limit and the placements itself.
    let e = fails(&words("bench memory -p 4 -m 8 --mem-limit 3"));
    assert!(e.contains("leave out --mem-limit"), "{e}");
    // A shape every schedule refuses is an error, not an empty table.
    let e = fails(&words("bench sim -p 0 -m 1"));
    assert!(e.contains("stages"), "{e}");
    let e = fails(&words("plan -s gpip -p 2 -m 2"));
    assert!(e.contains("did you mean gpipe?"), "{e}");
    // A timeline narrower than a label, or lines of gigabytes: refused, not widened or
    // allocated.
    for w in ["5", "10000000000"] {
        let e = fails(&words(&format!("plan -s 1f1b -p 2 -m 2 --width {w}")));
        assert!(e.contains("outside 10 to 100000"), "{e}");
    }
    let out = ok(&words("plan -s 1f1b -p 2 -m 2 --width 10"));
    assert!(
        out.lines()
            .any(|l| l.starts_with("rank  0 |") && l.len() == 20),
        "{out}"
    );
}

#[test]
fn inputs_are_read_bounded_and_from_standard_input() {
    // A device is read up to 64 MiB; a regular file is refused by its size before reading.
    let e = fails(&["check", "/dev/zero"]);
    assert!(
        e.contains("larger than 64 MiB") && e.contains("/dev/zero"),
        "{e}"
    );
    let sparse = file("sparse.csv", b"");
    let f = std::fs::File::options().write(true).open(&sparse).unwrap();
    f.set_len(2 << 30).unwrap();
    let e = fails(&["check", sparse.to_str().unwrap()]);
    assert!(e.contains("larger than 1024 MiB"), "{e}");
    let _ = std::fs::remove_file(&sparse);
    let e = fails(&words("plan -s 1f1b -p 2 -m 2 --costs /dev/zero"));
    assert!(e.contains("larger than 64 MiB"), "{e}");
    // A damaged cell of a megabyte is quoted by its start.
    let big = file("big.csv", &vec![b'x'; 1 << 20]);
    let e = fails(&["check", big.to_str().unwrap()]);
    assert!(
        e.len() < 1000 && e.contains("(1048576 bytes)"),
        "{}",
        &e[..e.len().min(1000)]
    );
    // `check -` reads the schedule from a pipe; `-f CSV` is `-f csv`.
    let csv = ok(&words("plan -s 1f1b -p 2 -m 2 -f CSV"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(["check", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(csv.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.starts_with("standard input: valid"),
        "{text}"
    );
}

#[test]
fn forecast_prices_layers_that_do_not_divide_at_the_busiest_stage() {
    let run = |layers: &str| {
        ok(&words(&format!(
            "forecast --tokens 1T --layers {layers} --hidden 4096 --heads 32 -p 8 --json"
        )))
    };
    // 1F1B's step and its busiest rank's busy time (step × (1 − bubble)).
    let step = |text: &str| -> (f64, f64) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let row = &v["schedules"][0];
        let t = row["step_seconds"].as_f64().unwrap();
        (t, t * (1.0 - row["bubble"].as_f64().unwrap()))
    };
    // 9 layers on 8 stages: one stage holds 2, as with 16 layers, so the step is at least
    // that stage's busy time (an even 1.125 per stage would make it 9/16 of 16 layers').
    let ((nine, _), (sixteen, busiest)) = (step(&run("9")), step(&run("16")));
    assert!(
        nine >= busiest * (1.0 - 1e-9) && nine < sixteen,
        "{nine} {busiest} {sixteen}"
    );
    let text = ok(&words(
        "forecast --tokens 1T --layers 9 --hidden 4096 --heads 32 -p 8",
    ));
    assert!(
        text.contains("9 layers (split 1,2,1,1,1,1,1,1 over the stages)"),
        "{text}"
    );
    // A V row splits over 2p chunks: shown where that split is uneven too.
    let text = ok(&words(
        "forecast --tokens 1T --layers 20 --hidden 4096 --heads 32 -p 4",
    ));
    assert!(
        text.contains("20 layers (split 2,3,3,3,3,2,2,2 over a V's chunks)"),
        "{text}"
    );
}

#[test]
fn check_names_a_json_report_given_for_a_csv() {
    let d = std::env::temp_dir().join(format!("nobubble-hostile-json-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let report = d.join("plan.json");
    let r = report.to_str().unwrap();
    ok(&[
        "plan", "-s", "1f1b", "-p", "2", "-m", "2", "-f", "json", "-o", r,
    ]);
    let e = fails(&["check", r]);
    assert!(e.contains("is JSON") && e.contains("-f csv"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
