//! Progress for work of unknown length (the planner's searches): a spinner with the elapsed
//! time on a terminal; off a terminal, a line every so often once the work has taken a
//! while, so a log shows a long plan is alive while short ones stay silent.

use crate::output::tell;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Off a terminal: the first line after this long, then one per `EVERY`.
const QUIET_FOR: Duration = Duration::from_secs(5);
const EVERY: Duration = Duration::from_secs(15);

/// Runs `work`, showing `label` on stderr while it runs: a spinner with the elapsed time
/// on a terminal (cleared at the end), else a `label… N s` line after 5 s and every 15 s.
pub fn while_working<T>(label: &str, work: impl FnOnce() -> T) -> T {
    let (done, wait) = mpsc::channel::<()>();
    let shown = show_until(label, wait);
    let out = work();
    drop(done);
    let _ = shown.join();
    out
}

/// Shows `label` on stderr, as [`while_working`] does, from now until `done`'s sender is
/// dropped (work that runs on other threads, such as the ranks' set-up).
pub fn show_until(label: &str, done: mpsc::Receiver<()>) -> std::thread::JoinHandle<()> {
    let label = label.to_string();
    let started = Instant::now();
    if !std::io::stderr().is_terminal() {
        return std::thread::spawn(move || {
            let mut next = QUIET_FOR;
            // Wakes when the work is done (the sender drops) or at the next report.
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                done.recv_timeout(next.saturating_sub(started.elapsed()))
            {
                tell!("{label}… {} s", started.elapsed().as_secs());
                next += EVERY;
            }
        });
    }
    std::thread::spawn(move || {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
        );
        bar.set_message(label);
        // Short work finishes before the first tick draws anything.
        bar.enable_steady_tick(Duration::from_millis(200));
        let _ = done.recv();
        bar.finish_and_clear();
    })
}
