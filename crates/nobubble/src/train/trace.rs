//! `--trace`: every measured pass as a Chrome trace event, streamed to disk step by step.
//! Holding the events until the end took memory in proportion to the steps (1.76 GB for
//! 10 000 steps of the micro model); now a run holds one step's events at a time. The file
//! is written beside the target and renamed into place when the run ends (a failed run's
//! trace too: it shows where the failure came), so a reader never sees half a trace.

use serde_json::Value;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A trace being written.
pub struct TraceFile {
    /// What the user asked for.
    path: PathBuf,
    /// Where the events go until the end.
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    events: u64,
}

impl TraceFile {
    /// Starts the trace for `path` (a file, or `-`/a device: written there at the end).
    pub fn create(path: &Path) -> Result<TraceFile, String> {
        let fail = |e: std::io::Error| format!("cannot write --trace {}: {e}", path.display());
        let tmp = crate::output::staging_for(path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(fail)?;
        let mut out = BufWriter::new(file);
        out.write_all(b"{\"traceEvents\":[").map_err(fail)?;
        Ok(TraceFile {
            path: path.to_path_buf(),
            tmp,
            out: Some(out),
            events: 0,
        })
    }

    /// Appends one event.
    pub fn event(&mut self, event: &Value) -> Result<(), String> {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        let sep: &[u8] = if self.events == 0 { b"\n" } else { b",\n" };
        out.write_all(sep)
            .and_then(|_| serde_json::to_writer(&mut *out, event).map_err(Into::into))
            .map_err(|e| format!("cannot write --trace {}: {e}", self.path.display()))?;
        self.events += 1;
        Ok(())
    }

    /// Closes the trace and puts it at its path.
    pub fn finish(mut self) -> Result<(), String> {
        self.close()?;
        crate::report::note_written(&self.path);
        Ok(())
    }

    fn close(&mut self) -> Result<(), String> {
        let Some(mut out) = self.out.take() else {
            return Ok(());
        };
        let written = out
            .write_all(b"\n]}\n")
            .and_then(|()| out.into_inner().map_err(|e| e.into_error()))
            .and_then(|file| file.sync_all());
        if let Err(e) = written {
            // A full disk: nothing to place, and the partial file would keep it full.
            let _ = std::fs::remove_file(&self.tmp);
            return Err(format!("cannot write --trace {}: {e}", self.path.display()));
        }
        let placed = crate::output::place(&self.tmp, &self.path);
        let _ = std::fs::remove_file(&self.tmp);
        placed
    }
}

impl Drop for TraceFile {
    /// A run that ended in an error still leaves its trace (best effort).
    fn drop(&mut self) {
        if self.out.is_some() && self.close().is_ok() {
            crate::report::note_written(&self.path);
        }
    }
}
