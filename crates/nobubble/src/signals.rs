//! Ctrl-C and SIGTERM for long jobs (and a closed output, see [`request_stop`]): the first
//! asks the run to stop cleanly after the current step (the log, trace, checkpoint and report
//! are written); a second ends the process at once with the usual status, 128 + the signal.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The stop a closed standard output or error asks for ([`crate::output::line`]): reported
/// as SIGPIPE's number, so the exit status is the 141 of a process a closed pipe ended.
pub const OUTPUT_CLOSED: usize = 13;

/// The number [`install`] returned, for [`request_stop`].
static WHICH: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// Asks the running job to stop after its step, as a first signal `sig` would (unless a
/// signal came first); nothing happens before [`install`].
pub fn request_stop(sig: usize) {
    if let Some(which) = WHICH.get() {
        let _ = which.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Installs the handlers; the returned value becomes the number of the first signal caught.
pub fn install() -> Result<Arc<AtomicUsize>, String> {
    let caught = Arc::new(AtomicBool::new(false));
    let which = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let fail = |e: std::io::Error| format!("cannot install the handler of signal {sig}: {e}");
        // Registered first, so it sees `caught` as the previous signal left it: the second
        // signal exits, the first only sets the flags below.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, caught.clone())
            .map_err(fail)?;
        signal_hook::flag::register_usize(sig, which.clone(), sig as usize).map_err(fail)?;
        signal_hook::flag::register(sig, caught.clone()).map_err(fail)?;
    }
    // A print into a closed pipe then fails (and stops the run cleanly, see
    // `output::line`) instead of ending the process with nothing saved.
    #[cfg(unix)]
    // SAFETY: only changes a signal disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let _ = WHICH.set(which.clone());
    Ok(which)
}
