//! Whether a run's activations fit in the memory the machines have free. Past it the kernel
//! kills the process (exit 137, no message) and every rank's work with it. Checked twice
//! before training — before the stages' memory is measured (a microbatch on each at once,
//! estimated from the model's shape) and on the plan's measured peak — the run instead ends
//! at once saying what to change.

use crate::error::RuntimeError;
use crate::rank::Rank;
use crate::session::{estimated_layer_costs, human_bytes, SessionOptions};
use nobubble_schedule::Schedule;
use serde::{Deserialize, Serialize};

/// What one rank reports: its machine, the memory free there, and what its plan will add.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The machine's host name (ranks with the same one share its memory).
    pub host: String,
    /// Memory the kernel could give this machine's processes without swapping
    /// (`MemAvailable`), or `None` where it cannot be read.
    pub available: Option<u64>,
    /// Bytes the rank will hold at its plan's peak: the predicted activations.
    pub need: f64,
}

impl Reading {
    /// This machine's reading for a rank that will hold `need` bytes.
    pub fn here(need: f64) -> Reading {
        Reading {
            host: host_name(),
            available: available_bytes(),
            need,
        }
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (Linux); for tests,
/// `NOBUBBLE_MEM_AVAILABLE` (bytes) stands in for it.
pub fn available_bytes() -> Option<u64> {
    if let Some(v) = std::env::var_os("NOBUBBLE_MEM_AVAILABLE") {
        return v.to_str()?.parse().ok();
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Every rank's reading, in rank order: an error naming the first machine whose ranks would
/// hold more than it has free (`what` holds the readings' need: "the plan holds"), and what
/// to change: a memory limit (`suggest_limit`: when the schedule could plan within one), or
/// smaller microbatches. Every rank judges the same readings, so all come to the same
/// verdict.
pub fn check_fits(readings: &[Reading], what: &str, suggest_limit: bool) -> Result<(), String> {
    let mut hosts: Vec<&str> = readings.iter().map(|r| r.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    for host in hosts {
        let ranks: Vec<usize> = (0..readings.len())
            .filter(|&r| readings[r].host == host)
            .collect();
        // The smallest reading: the ranks read at slightly different moments.
        let Some(free) = ranks.iter().filter_map(|&r| readings[r].available).min() else {
            continue;
        };
        let need: f64 = ranks.iter().map(|&r| readings[r].need).sum();
        if need > free as f64 {
            let name = if host.is_empty() {
                "this machine".to_string()
            } else {
                format!("machine {host}")
            };
            let fix = if suggest_limit {
                format!(
                    "give a limit (e.g. --mem-limit {} for each rank; zb-auto plans within it), \
                     or use a smaller microbatch or sequence",
                    suggested_limit(0.8 * free as f64 / ranks.len() as f64)
                )
            } else {
                "use a smaller microbatch or sequence, or more machines".to_string()
            };
            return Err(format!(
                "{what} {} of activations on the {} rank{} of {name}, which has {} free: {fix}",
                human_bytes(need),
                ranks.len(),
                if ranks.len() == 1 { "" } else { "s" },
                human_bytes(free as f64),
            ));
        }
    }
    Ok(())
}

/// `bytes` as a `--mem-limit` size, rounded down: `8.3GiB`, else whole MiB or KiB.
fn suggested_limit(bytes: f64) -> String {
    const KIB: f64 = 1024.0;
    if bytes >= KIB * KIB * KIB {
        format!(
            "{:.1}GiB",
            (bytes / (KIB * KIB * KIB) * 10.0).floor() / 10.0
        )
    } else if bytes >= KIB * KIB {
        format!("{}MiB", (bytes / (KIB * KIB)).floor())
    } else {
        format!("{}KiB", (bytes / KIB).floor().max(1.0))
    }
}

/// Whether `need` bytes on this rank, with every other rank's, fit in the memory the machines
/// have free ([`crate::machine`]). A collective: the ranks exchange their readings and all
/// judge the same ones.
pub(crate) fn fits(
    rank: &mut Rank,
    need: f64,
    what: &str,
    suggest_limit: bool,
) -> Result<Result<(), String>, RuntimeError> {
    let mine = Reading::here(need);
    let bytes = serde_json::to_vec(&mine).expect("a reading serializes");
    let readings = (rank.all_gather(bytes)?.iter())
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<Vec<Reading>, _>>()
        .map_err(|e| RuntimeError::Fault(format!("damaged memory reading: {e}")))?;
    Ok(check_fits(&readings, what, suggest_limit))
}

/// About what measuring this rank's stages holds: one microbatch on each at once, from the
/// model's shape ([`estimated_layer_costs`]); `rank` is global.
pub(crate) fn probe_bytes(opts: &SessionOptions, schedule: &Schedule, rank: usize) -> f64 {
    let pipeline_rank = rank % schedule.ranks;
    let model = &opts.run.model;
    let est = estimated_layer_costs(model);
    let block = est.block.map_or(0.0, |b| b.mem_b);
    let counts = nobubble_nn::config::block_counts(model.layers, schedule.stages, &opts.run.layout)
        .unwrap_or_else(|_| vec![model.layers.div_ceil(schedule.stages); schedule.stages]);
    let last = schedule.stages - 1;
    (schedule.stages_of(pipeline_rank).into_iter())
        .map(|s| {
            counts[s] as f64 * block
                + if s == 0 { est.embedding.mem_b } else { 0.0 }
                + if s == last { est.head.mem_b } else { 0.0 }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(host: &str, available: Option<u64>, need: f64) -> Reading {
        Reading {
            host: host.into(),
            available,
            need,
        }
    }

    #[test]
    fn the_ranks_of_a_machine_share_its_memory() {
        const GIB: u64 = 1 << 30;
        let g = GIB as f64;
        // Two ranks of 6 GiB each fit in 16 GiB; three do not.
        assert_eq!(
            check_fits(
                &vec![reading("a", Some(16 * GIB), 6.0 * g); 2],
                "holds",
                true
            ),
            Ok(())
        );
        let e = check_fits(
            &vec![reading("a", Some(16 * GIB), 6.0 * g); 3],
            "holds",
            true,
        )
        .unwrap_err();
        assert!(e.contains("holds 18.00 GiB of activations"), "{e}");
        assert_eq!(suggested_limit(300.5 * (1u64 << 20) as f64), "300MiB");
        assert_eq!(suggested_limit(40000.0), "39KiB");
        assert!(
            e.contains("3 ranks of machine a, which has 16.00 GiB free"),
            "{e}"
        );
        assert!(e.contains("--mem-limit 4.2GiB"), "{e}");
        // On two machines, each judged by its own ranks; the smallest reading counts.
        let two = [
            reading("a", Some(16 * GIB), 6.0 * g),
            reading("b", Some(16 * GIB), 6.0 * g),
            reading("a", Some(16 * GIB), 6.0 * g),
            reading("b", Some(11 * GIB), 6.0 * g),
        ];
        let e = check_fits(&two, "holds", true).unwrap_err();
        assert!(
            e.contains("2 ranks of machine b, which has 11.00 GiB free"),
            "{e}"
        );
        // Unreadable memory is not judged.
        assert_eq!(
            check_fits(&[reading("", None, 1e30)], "holds", true),
            Ok(())
        );
    }

    #[test]
    fn this_machine_reads_its_free_memory() {
        let here = Reading::here(1.0);
        let free = here.available.expect("Linux has MemAvailable");
        assert!(free > 1 << 20, "{free}");
    }
}
