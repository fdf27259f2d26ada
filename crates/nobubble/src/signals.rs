//! Ctrl-C and SIGTERM for long jobs: the first asks the run to stop cleanly after the current
//! step (the log, trace, checkpoint and report are written); a second ends the process at
//! once with the usual status, 128 + the signal.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

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
    Ok(which)
}
