//! A spinner with the elapsed time for work of unknown length (the planner's searches), on a
//! terminal only: scripts and logs see nothing.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Runs `work`, showing `label` with a spinner and the elapsed time on stderr while it runs
/// (when stderr is a terminal); the spinner is cleared at the end.
pub fn while_working<T>(label: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    bar.set_message(label.to_string());
    // Short work finishes before the first tick draws anything.
    bar.enable_steady_tick(Duration::from_millis(200));
    let out = work();
    bar.finish_and_clear();
    out
}
