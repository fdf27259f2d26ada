//! Running the `nobubble` binary from the integration tests.
#![allow(dead_code)] // each test file uses a different subset of these helpers

use std::process::{Command, Output};

/// Runs the binary with `args` (no colour).
pub fn nobubble(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nobubble"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("binary runs")
}

/// Runs a command that must succeed and returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = nobubble(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail and returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = nobubble(args);
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// A command line written as one string (no argument holds a space).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// A `train` command line on the micro model for `steps` steps, followed by `extra`: the
/// quick settings most tests share, written once.
pub fn micro_train<'a>(steps: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["train", "--model", "micro", "--steps", steps];
    v.extend_from_slice(extra);
    v
}
