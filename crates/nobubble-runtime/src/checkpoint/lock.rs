//! A run directory's lock: while a run may save into `--save DIR`, `DIR/.lock` names its
//! process. Two runs saving into one directory would overwrite each other's checkpoints (and
//! share one staging directory per step), so the second is refused before it trains. A lock
//! whose process is gone (a crash, a kill) is taken over.

use crate::error::RuntimeError;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The lock file's name in a run directory.
pub const LOCK: &str = ".lock";

/// Held while a run may save into its directory; removing the file when dropped.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a lock file says: the process and the machine.
fn holder() -> String {
    format!("{} {}\n", std::process::id(), host())
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether the process `pid` of this machine still runs.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Creates the run directory `run` (so an unwritable `--save` fails now, not after the
/// training) and locks it for this process.
pub fn lock_run(run: &Path) -> Result<RunLock, RuntimeError> {
    let cannot = |what: &str, e: std::io::Error| {
        RuntimeError::io(run, format!("cannot {what} {}: {e}", run.display()))
    };
    std::fs::create_dir_all(run).map_err(|e| cannot("create", e))?;
    let path = run.join(LOCK);
    // Twice at most: once more after taking over a stale lock.
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(holder().as_bytes())
                    .map_err(|e| cannot("write the lock in", e))?;
                return Ok(RunLock { path });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let mut words = text.split_whitespace();
                let pid = words.next().and_then(|p| p.parse::<u32>().ok());
                let their_host = words.next().unwrap_or("").to_string();
                match pid {
                    Some(pid) if their_host == host() && !alive(pid) => {
                        // A run that ended without removing it: take it over.
                        std::fs::remove_file(&path)
                            .map_err(|e| cannot("remove a stale lock in", e))?;
                    }
                    _ => return Err(locked(run, &path, pid, &their_host)),
                }
            }
            Err(e) => return Err(cannot("lock", e)),
        }
    }
    Err(locked(run, &path, None, ""))
}

fn locked(run: &Path, lock: &Path, pid: Option<u32>, host: &str) -> RuntimeError {
    let who = match (pid, host) {
        (Some(pid), "") => format!("process {pid}"),
        (Some(pid), h) => format!("process {pid} on {h}"),
        (None, _) => "another process".to_string(),
    };
    RuntimeError::Config(format!(
        "another run ({who}) is saving into {}: the two would overwrite each other's \
         checkpoints. Save to another directory, or wait for that run to end; if no run uses \
         it any more (its machine went down), delete {}",
        run.display(),
        lock.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_a_stale_one_taken_over() {
        let dir = std::env::temp_dir().join(format!("nobubble-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let run = dir.join("run");
        let first = lock_run(&run).unwrap();
        let e = lock_run(&run).unwrap_err().to_string();
        assert!(
            e.contains("another run") && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(first);
        assert!(
            !run.join(LOCK).exists(),
            "the lock is removed with its holder"
        );
        // A lock left by a process that is gone (pid beyond any the kernel hands out).
        std::fs::write(run.join(LOCK), format!("4294967295 {}\n", host())).unwrap();
        let taken = lock_run(&run).unwrap();
        let text = std::fs::read_to_string(run.join(LOCK)).unwrap();
        assert!(text.starts_with(&std::process::id().to_string()), "{text}");
        drop(taken);
        // Another machine's lock cannot be checked: refused, saying how to clear it.
        std::fs::write(run.join(LOCK), "12 elsewhere\n").unwrap();
        let e = lock_run(&run).unwrap_err().to_string();
        assert!(
            e.contains("process 12 on elsewhere") && e.contains("delete"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_run_directory_fails_at_once() {
        let e = lock_run(Path::new("/proc/nobubble-run"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot create /proc/nobubble-run"), "{e}");
    }
}
