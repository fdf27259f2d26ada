//! Progress for work of unknown length (the planner's searches): a spinner with the elapsed
//! time on a terminal; off a terminal, a line every so often once the work has taken a
//! while, so a log shows a long plan is alive while short ones stay silent.

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
    if !std::io::stderr().is_terminal() {
        let (done, wait) = mpsc::channel::<()>();
        let label = label.to_string();
        let started = Instant::now();
        let ticker = std::thread::spawn(move || {
            let mut next = QUIET_FOR;
            // Wakes when the work is done (the sender drops) or at the next report.
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(next.saturating_sub(started.elapsed()))
            {
                eprintln!("{label}… {} s", started.elapsed().as_secs());
                next += EVERY;
            }
        });
        let out = work();
        drop(done);
        let _ = ticker.join();
        return out;
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
