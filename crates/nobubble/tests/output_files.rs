//! `-o FILE` never loses what is there: devices and FIFOs are written through, symlinks
//! followed, a user's files beside the target untouched, no temporary file left behind on
//! failure; a full stdout is an error, not a panic.

mod common;
use common::{fails, micro_train, nobubble, ok};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-out-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn plan_to(path: &Path) -> std::process::Output {
    nobubble(&[
        "plan",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "-f",
        "csv",
        "-o",
        path.to_str().unwrap(),
    ])
}

#[test]
fn a_users_files_beside_the_target_survive_and_nothing_is_left_behind() {
    let d = dir("beside");
    std::fs::write(d.join("out.csv.tmp"), "mine").unwrap();
    std::fs::write(d.join("out.csv"), "old").unwrap();
    assert!(plan_to(&d.join("out.csv")).status.success());
    assert_eq!(
        std::fs::read_to_string(d.join("out.csv.tmp")).unwrap(),
        "mine"
    );
    assert!(std::fs::read_to_string(d.join("out.csv"))
        .unwrap()
        .starts_with("0F0,"));
    assert_eq!(names(&d), ["out.csv", "out.csv.tmp"]);
    // A private file stays private when replaced.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.join("out.csv"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(plan_to(&d.join("out.csv")).status.success());
    let mode = std::fs::metadata(d.join("out.csv"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A directory as the target: a clean error, and no temporary file beside it.
    std::fs::create_dir(d.join("sub")).unwrap();
    let e = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "-o",
        d.join("sub").to_str().unwrap(),
    ]);
    assert!(e.contains("is a directory"), "{e}");
    assert_eq!(names(&d), ["out.csv", "out.csv.tmp", "sub"]);
    // A directory that does not exist: an error, nothing created.
    let e = fails(&[
        "plan",
        "-s",
        "1f1b",
        "-p",
        "2",
        "-m",
        "2",
        "-o",
        d.join("no/such.csv").to_str().unwrap(),
    ]);
    assert!(e.contains("cannot write"), "{e}");
    assert_eq!(names(&d), ["out.csv", "out.csv.tmp", "sub"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn symlinks_are_followed_not_replaced() {
    let d = dir("link");
    std::fs::write(d.join("real.csv"), "old").unwrap();
    std::os::unix::fs::symlink("real.csv", d.join("link.csv")).unwrap();
    assert!(plan_to(&d.join("link.csv")).status.success());
    let meta = std::fs::symlink_metadata(d.join("link.csv")).unwrap();
    assert!(meta.file_type().is_symlink(), "the link was replaced");
    assert!(std::fs::read_to_string(d.join("real.csv"))
        .unwrap()
        .starts_with("0F0,"));
    // A dangling link is refused, not replaced by a file.
    std::os::unix::fs::symlink("gone/nowhere.csv", d.join("dangling.csv")).unwrap();
    assert!(!plan_to(&d.join("dangling.csv")).status.success());
    assert!(std::fs::symlink_metadata(d.join("dangling.csv"))
        .unwrap()
        .file_type()
        .is_symlink());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn devices_and_fifos_are_written_through() {
    use std::os::unix::fs::FileTypeExt;
    let d = dir("special");
    // A FIFO: a reader gets the content, the FIFO stays a FIFO.
    let fifo = d.join("pipe");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // The read end is opened first, without blocking, so the test can never hang: the
    // content waits in the pipe's buffer until it is read.
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    assert!(plan_to(&fifo).status.success());
    let mut got = String::new();
    let _ = reader.read_to_string(&mut got);
    assert!(got.starts_with("0F0,"), "{got:?}");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // A character device made here (as /dev/null is: major 1, minor 3), never the system's.
    let null = d.join("null");
    let made = Command::new("mknod")
        .arg(&null)
        .args(["c", "1", "3"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if made {
        assert!(plan_to(&null).status.success());
        assert!(std::fs::metadata(&null)
            .unwrap()
            .file_type()
            .is_char_device());
    } else {
        eprintln!("mknod not permitted here: the device case is covered by the FIFO only");
    }
    assert_eq!(names(&d).len(), if made { 2 } else { 1 });
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(["plan", "-s", "1f1b", "-p", "8", "-m", "32", "-f", "json"])
        .stdout(Stdio::from(full))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("error: cannot write to stdout"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The table commands print line by line: the same.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(["compare", "-p", "4", "-m", "8"])
        .stdout(Stdio::from(full))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write to stdout"));
    // `-o -` is stdout.
    assert!(
        ok(&["plan", "-s", "1f1b", "-p", "2", "-m", "2", "-f", "csv", "-o", "-"])
            .starts_with("0F0,")
    );
}

#[test]
fn dev_stdout_appended_to_a_file_keeps_what_was_there() {
    let d = dir("stdout");
    let log = d.join("log.txt");
    std::fs::write(&log, "before\n").unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} plan -s 1f1b -p 2 -m 2 -f csv -o /dev/stdout >> {}",
            env!("CARGO_BIN_EXE_nobubble"),
            log.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("before\n0F0,"), "{text:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `--trace` is streamed to a file beside the target and renamed into place at the end: a
/// finished run's trace holds every pass of every step, a run that failed still leaves the
/// steps it ran, and no temporary file stays behind either way.
#[test]
fn a_trace_is_complete_at_the_end_and_kept_when_a_run_fails() {
    let d = dir("trace");
    let trace = d.join("t.json");
    let t = trace.to_str().unwrap();
    let events = || -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
        v["traceEvents"].as_array().unwrap().clone()
    };
    ok(&[
        "train", "--model", "micro", "--steps", "5", "-m", "2", "--trace", t,
    ]);
    // micro: 2 ranks, one stage each, F, I and W of 2 microbatches per step.
    let all = events();
    assert_eq!(all.len(), 5 * 2 * 3 * 2);
    let steps: std::collections::BTreeSet<u64> = all
        .iter()
        .map(|e| e["args"]["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps.len(), 5);
    assert_eq!(names(&d), ["t.json"]);
    // Stopped by non-finite losses (an error): the steps it ran are in the trace.
    let e = fails(&[
        "train", "--model", "micro", "--steps", "50", "-m", "2", "--lr", "1e30", "--trace", t,
    ]);
    assert!(e.contains("was not finite"), "{e}");
    let ran = events();
    assert!(!ran.is_empty() && ran.len() < 50 * 12, "{}", ran.len());
    assert_eq!(names(&d), ["t.json"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// Without `-f`, `-o`'s extension chooses the format; a `-f` that contradicts it is obeyed
/// with a note.
#[test]
fn the_output_extension_chooses_the_format() {
    let d = dir("ext");
    let plan = |extra: &[&str]| {
        let mut a = vec!["plan", "-s", "zb-h1", "-p", "2", "-m", "2"];
        a.extend_from_slice(extra);
        nobubble(&a)
    };
    let path = |n: &str| d.join(n).to_str().unwrap().to_string();
    for (name, starts) in [
        ("p.svg", "<svg"),
        ("p.csv", "0F0,"),
        ("p.json", "{"),
        ("p.txt", "zb-h1"),
    ] {
        let out = plan(&["-o", &path(name)]);
        assert!(out.status.success());
        let text = std::fs::read_to_string(d.join(name)).unwrap();
        assert!(
            text.starts_with(starts),
            "{name}: {}",
            &text[..40.min(text.len())]
        );
    }
    let out = plan(&["-f", "svg", "-o", &path("q.csv")]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("note: writing svg to") && err.contains("says csv"),
        "{err}"
    );
    assert!(std::fs::read_to_string(d.join("q.csv"))
        .unwrap()
        .starts_with("<svg"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn two_train_outputs_naming_one_file_are_refused_before_training() {
    let d = dir("same");
    let report = d.join("out.json");
    std::fs::write(&report, "mine").unwrap();
    // The same file by another spelling, and by a link.
    let other = d.join(".").join("out.json");
    let link = d.join("link.json");
    std::os::unix::fs::symlink(&report, &link).unwrap();
    let hard = d.join("hard.json");
    std::fs::hard_link(&report, &hard).unwrap();
    for (flag, path) in [
        ("--log", &other),
        ("--trace", &link),
        ("--timeline-svg", &hard),
    ] {
        let r = report.to_str().unwrap();
        let err = fails(&micro_train(
            "1",
            &["--report", r, flag, path.to_str().unwrap()],
        ));
        assert!(err.contains("name the same file"), "{err}");
        assert!(err.contains(flag) && err.contains("--report"), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "mine");
    // Devices take any number of writers.
    ok(&micro_train(
        "1",
        &["--report", "/dev/null", "--trace", "/dev/null"],
    ));
    let _ = std::fs::remove_dir_all(&d);
}
