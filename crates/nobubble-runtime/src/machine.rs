//! Whether a run fits in the memory its machines have free. Past it the kernel kills the
//! process (exit 137, no message) and every rank's work with it; checked before training,
//! the run instead ends at once saying what to change — or, for an automatic schedule given
//! no limit, plans within what is free ([`activation_budgets`]).
//!
//! Twice, both after the weights are built: before the stages' memory is measured (the
//! largest stage's microbatch, counted exactly from the model's shape, since stages are
//! measured one at a time), and on the plan's measured peak (again after each re-plan).
//! What a rank will add to what it holds now counts: activations, and the optimizer's
//! moments and gradients, which are allocated untouched and take memory only when first
//! written. The plans are judged against the free memory read once, right after the
//! measurement: what the measurement left resident is mostly not reused by training, while
//! training's own cached buffers are (a reading after steps would count them twice).

pub mod cgroup;

use crate::error::RuntimeError;
use crate::rank::Rank;
use crate::session::{human_bytes, SessionOptions};
use nobubble_nn::GptConfig;
use nobubble_schedule::Schedule;
use serde::{Deserialize, Serialize};

/// What one rank reports: its machine, the memory free there, and what it will add.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// Which machine (its kernel's boot id; ranks with the same one share its memory).
    pub machine: String,
    /// The machine's host name, for messages.
    pub host: String,
    /// Memory the machine's kernel could give without swapping (`MemAvailable`), or `None`
    /// where it cannot be read.
    pub available: Option<u64>,
    /// The rank's memory cgroup, where one sets a limit (a container): judged on its own,
    /// besides the machine.
    #[serde(default)]
    pub cgroup: Option<CgroupReading>,
    /// Activation bytes the rank will add.
    pub activations: f64,
    /// Bytes of optimizer state and gradients the rank will add (not helped by a limit).
    pub state: f64,
}

/// A memory cgroup's room, as one rank read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CgroupReading {
    /// Which cgroup: the boot id and the cgroup directory's inode, the same inside and
    /// outside a container's namespace (so two containers never share an id).
    pub id: String,
    /// The bytes it still allows.
    pub headroom: u64,
    /// Its limit.
    pub limit: u64,
}

impl Reading {
    /// This machine's reading for a rank that will add `activations` and `state` bytes.
    pub fn here(activations: f64, state: f64) -> Reading {
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
        let host = read("/proc/sys/kernel/hostname").unwrap_or_default();
        let machine = read("/proc/sys/kernel/random/boot_id").unwrap_or_else(|_| host.clone());
        let (available, cgroup) = match test_override() {
            Some(v) => (Some(v), None),
            None => (mem_available(), cgroup::headroom()),
        };
        let cgroup = cgroup.map(|c| CgroupReading {
            id: format!("{machine}:{}", c.inode),
            headroom: c.bytes,
            limit: c.limit,
        });
        Reading {
            machine,
            host,
            available,
            cgroup,
            activations,
            state,
        }
    }
}

/// For tests: a number of bytes in `NOBUBBLE_MEM_AVAILABLE` stands in for the free memory
/// (and no cgroup is read).
fn test_override() -> Option<u64> {
    std::env::var("NOBUBBLE_MEM_AVAILABLE")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (Linux).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What to tell a run that does not fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Remedy {
    /// A smaller microbatch or sequence, or more machines.
    Smaller,
    /// A memory limit, for a schedule that plans within one, if a limit of at least this
    /// many bytes per rank (every rank's one microbatch) would fit; else as `Smaller`.
    Limit(f64),
    /// As `Limit`, where the user gave a limit that is too large: a lower one.
    LowerLimit(f64),
}

/// Every rank's reading, in rank order: an error naming the first machine or container
/// whose ranks would add more than it has free (`what` says to what the activations
/// belong: "the plan's peak"), and what to change. Each memory cgroup with a limit is judged
/// by its own ranks against its headroom, and each machine by all its ranks against
/// `MemAvailable`. Every rank judges the same readings, so all come to the same verdict.
pub fn check_fits(readings: &[Reading], what: &str, remedy: Remedy) -> Result<(), String> {
    for group in groups(readings) {
        let here: Vec<&Reading> = group.ranks.iter().map(|&r| &readings[r]).collect();
        judge(&here, group.free, &group.under, what, remedy)?;
    }
    Ok(())
}

/// Of the memory free to a group of ranks after their optimizer state, the share their
/// activations may plan on: a fifth stays for what a plan's peak does not count (the
/// allocator's slack, a pass's temporaries).
const PLANNABLE: f64 = 0.8;

/// The activation bytes each rank (in rank order) may plan on: its share of what is free to
/// it after every rank's optimizer state there, in its memory cgroup and on its machine,
/// whichever is less. `None` for a rank no reading bounds. What an automatic schedule plans
/// within when the user gave no limit and its own plan would not fit.
pub fn activation_budgets(readings: &[Reading]) -> Vec<Option<f64>> {
    let mut budgets = vec![None; readings.len()];
    for group in groups(readings) {
        let Some(free) = group.free else { continue };
        let state: f64 = group.ranks.iter().map(|&r| readings[r].state).sum();
        let share = plannable_share(free as f64, state, group.ranks.len());
        for &r in &group.ranks {
            budgets[r] = Some(budgets[r].map_or(share, |b: f64| b.min(share)));
        }
    }
    budgets
}

/// What each of `n` ranks may plan on in `free` bytes once `state` is allocated.
fn plannable_share(free: f64, state: f64, n: usize) -> f64 {
    (PLANNABLE * (free - state) / n as f64).max(0.0)
}

/// Ranks that share one amount of free memory: a memory cgroup with a limit, or a machine.
struct Group {
    /// Their indices in the readings.
    ranks: Vec<usize>,
    /// The least free memory any of them read (they read at slightly different moments);
    /// `None` if it cannot be read.
    free: Option<u64>,
    /// Whose limit that is, for messages (empty for a machine's).
    under: String,
}

/// The cgroups with a limit, then the machines, each with its ranks.
fn groups(readings: &[Reading]) -> Vec<Group> {
    let mut groups = Vec::new();
    let mut cgroups: Vec<&str> = (readings.iter())
        .filter_map(|r| r.cgroup.as_ref().map(|c| c.id.as_str()))
        .collect();
    cgroups.sort_unstable();
    cgroups.dedup();
    for id in cgroups {
        let ranks: Vec<usize> = (0..readings.len())
            .filter(|&r| readings[r].cgroup.as_ref().is_some_and(|c| c.id == id))
            .collect();
        let cgroup = |r: &usize| readings[*r].cgroup.as_ref();
        let free = ranks.iter().filter_map(cgroup).map(|c| c.headroom).min();
        let limit = ranks.iter().find_map(cgroup).map(|c| c.limit);
        let under = under_cgroup_limit(limit);
        groups.push(Group { ranks, free, under });
    }
    let mut machines: Vec<&str> = readings.iter().map(|r| r.machine.as_str()).collect();
    machines.sort_unstable();
    machines.dedup();
    for machine in machines {
        let ranks: Vec<usize> = (0..readings.len())
            .filter(|&r| readings[r].machine == machine)
            .collect();
        let free = ranks.iter().filter_map(|&r| readings[r].available).min();
        let under = String::new();
        groups.push(Group { ranks, free, under });
    }
    groups
}

/// " under its memory cgroup's limit of …", for a message about memory a cgroup's `limit`
/// bounds; empty without one.
fn under_cgroup_limit(limit: Option<u64>) -> String {
    limit.map_or(String::new(), |l| {
        format!(
            " under its memory cgroup's limit of {} (a container's)",
            human_bytes(l as f64)
        )
    })
}

/// Whether the ranks `here` fit in `free` bytes (`None`: unknown, not judged); `under` says
/// whose limit that is, for the message.
fn judge(
    here: &[&Reading],
    free: Option<u64>,
    under: &str,
    what: &str,
    remedy: Remedy,
) -> Result<(), String> {
    let Some(free) = free else {
        return Ok(());
    };
    let free = free as f64;
    let activations: f64 = here.iter().map(|r| r.activations).sum();
    let state: f64 = here.iter().map(|r| r.state).sum();
    if activations + state <= free {
        return Ok(());
    }
    let n = here.len();
    let host = &here[0].host;
    let name = if host.is_empty() {
        "this machine".to_string()
    } else {
        format!("machine {host}")
    };
    let state_part = if state > 0.0 {
        format!(
            " and {} of optimizer state and gradients",
            human_bytes(state)
        )
    } else {
        String::new()
    };
    let per_rank = plannable_share(free, state, n);
    let fix = match remedy {
        Remedy::Limit(least) | Remedy::LowerLimit(least) if per_rank >= least => {
            let ask = match remedy {
                Remedy::LowerLimit(_) => "lower the limit",
                _ => "give a limit",
            };
            format!(
                "{ask} (e.g. --mem-limit {} for each rank; zb-auto plans within it), or use a \
                 smaller microbatch or sequence",
                suggested_limit(per_rank)
            )
        }
        _ => "use a smaller microbatch or sequence, fewer layers, or more machines".into(),
    };
    Err(format!(
        "{what} takes {} of activations{state_part} on the {n} rank{} of {name}, which has {} \
         free{under}: {fix}",
        human_bytes(activations),
        if n == 1 { "" } else { "s" },
        human_bytes(free),
    ))
}

/// Bytes per parameter a rank keeps: the weight, its gradient and AdamW's two moments.
const BYTES_PER_PARAMETER: f64 = 16.0;

/// Whether `replicas` copies of `model`'s weights, gradients and optimizer moments fit in
/// the memory this machine has free, for a job whose ranks are all threads of this process.
/// Checked before any rank allocates (each rank reading the free memory while the others
/// allocate theirs would refuse wrongly).
pub fn check_weights(model: &GptConfig, replicas: usize) -> Result<(), String> {
    let Some((free, cgroup_limit)) = free_here() else {
        return Ok(());
    };
    let params = (model.parameter_count() + model.tied_copy_parameter_count()) as f64;
    let need = params * BYTES_PER_PARAMETER * replicas.max(1) as f64;
    if need > free as f64 {
        return Err(format!(
            "the model's weights, gradients and AdamW moments take {} ({:.2} M parameters × 16 \
             bytes{}), and this machine has {} free{}: use fewer layers or a smaller hidden \
             size, or spread the ranks over several machines (mpirun)",
            human_bytes(need),
            params / 1e6,
            if replicas > 1 {
                format!(" × {replicas} data-parallel replicas")
            } else {
                String::new()
            },
            human_bytes(free as f64),
            under_cgroup_limit(cgroup_limit),
        ));
    }
    Ok(())
}

/// The bytes this machine has free (the tighter of `MemAvailable` and the process's memory
/// cgroup), with the cgroup's limit when it is the tighter; `None` if unknown.
fn free_here() -> Option<(u64, Option<u64>)> {
    let here = Reading::here(0.0, 0.0);
    let cgroup = (here.cgroup.as_ref()).filter(|c| here.available.is_none_or(|a| c.headroom < a));
    match cgroup {
        Some(c) => Some((c.headroom, Some(c.limit))),
        None => here.available.map(|a| (a, None)),
    }
}

/// Whether `need` bytes (for `what`: "attention over a window of 4096 tokens") fit in the
/// memory this machine has free; the error names both and ends with `remedy`. For work of
/// one process that would otherwise abort on a failed allocation.
pub fn check_free(need: f64, what: &str, remedy: &str) -> Result<(), String> {
    let Some((free, cgroup_limit)) = free_here() else {
        return Ok(());
    };
    if need > free as f64 {
        return Err(format!(
            "{what} takes {}, and this machine has {} free{}: {remedy}",
            human_bytes(need),
            human_bytes(free as f64),
            under_cgroup_limit(cgroup_limit),
        ));
    }
    Ok(())
}

/// Whether `threads` per operation (`flag` names where they came from) are within reach of
/// the cores this process may use: far beyond them, threads only wait on each other's turn
/// at every split of a kernel (1000 on 2 cores made no step in ten minutes). A few more than
/// it sees, as under mpirun's core binding, are the caller's warning to give.
pub fn check_threads(flag: &str, threads: usize) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > 4 * cores {
        return Err(format!(
            "{flag} {threads} is far more than the {cores} cores this process may use; use at \
             most {cores}"
        ));
    }
    Ok(())
}

/// Bytes an emulated rank thread holds per pass of the schedule (its copy of the schedule,
/// its program and bookkeeping): measured 34 with 256 ranks × 196 608 passes (1.7 GB).
const EMULATED_BYTES_PER_PASS: f64 = 40.0;

/// Whether `ranks` emulated rank threads, each holding a schedule of `passes` passes, fit
/// in the memory this machine has free: emulation's memory grows as ranks × passes, so a
/// large pipeline would otherwise run the machine out of memory while it sets up.
pub fn check_emulated(ranks: usize, passes: usize) -> Result<(), String> {
    let Some((free, cgroup_limit)) = free_here() else {
        return Ok(());
    };
    let need = ranks as f64 * passes as f64 * EMULATED_BYTES_PER_PASS;
    if need > free as f64 {
        return Err(format!(
            "emulating {ranks} ranks of a {passes}-pass schedule takes about {} (every rank \
             thread holds the schedule), and this machine has {} free{}: emulate fewer ranks or \
             microbatches, spread the ranks over several machines (mpirun), or simulate it \
             without threads (`nobubble plan` or `compare` with the same flags)",
            human_bytes(need),
            human_bytes(free as f64),
            under_cgroup_limit(cgroup_limit),
        ));
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

/// Every rank's reading, this rank's built from `activations` and `state`: a collective
/// (every rank calls it at the same point).
pub(crate) fn gather(
    rank: &mut Rank,
    activations: f64,
    state: f64,
) -> Result<Vec<Reading>, RuntimeError> {
    let mine = Reading::here(activations, state);
    let bytes = serde_json::to_vec(&mine).expect("a reading serializes");
    (rank.all_gather(bytes)?.iter())
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<Vec<Reading>, _>>()
        .map_err(|e| RuntimeError::Fault(format!("damaged memory reading: {e}")))
}

/// A rank's stages: each stage's microbatch activations and parameter count, from the
/// model's shape as the engine stores them ([`GptConfig::block_bytes`], `embedding_bytes`,
/// `head_bytes`: exact, so the check neither lets through a run that cannot fit nor refuses
/// one that can).
fn stage_estimates(opts: &SessionOptions, schedule: &Schedule, rank: usize) -> Vec<(f64, f64)> {
    let model = &opts.run.model;
    let block = model.block_bytes().0;
    let block_params = model.block_parameter_count() as f64;
    let counts = nobubble_nn::config::block_counts(model.layers, schedule.stages, &opts.run.layout)
        .unwrap_or_else(|_| vec![model.layers.div_ceil(schedule.stages); schedule.stages]);
    let last = schedule.stages - 1;
    (schedule.stages_of(rank % schedule.ranks).into_iter())
        .map(|s| {
            let blocks = counts[s] as f64;
            let (mut bytes, mut params) = (blocks * block, blocks * block_params);
            if s == 0 {
                bytes += model.embedding_bytes().0;
                params += model.embedding_parameter_count() as f64;
            }
            if s == last {
                bytes += model.head_bytes().0;
                params += (model.head_parameter_count() + model.tied_copy_parameter_count()) as f64;
            }
            (bytes, params)
        })
        .collect()
}

/// What measuring the stages' memory adds on global rank `rank`, as (activations, state):
/// the largest stage's microbatch (stages are measured one after another, each freed after
/// its W) and the gradients the measurement writes, with the copy it restores them from; on
/// the first replica only (the others measure nothing).
pub(crate) fn measurement_bytes(
    opts: &SessionOptions,
    schedule: &Schedule,
    rank: usize,
) -> (f64, f64) {
    if rank >= schedule.ranks {
        return (0.0, 0.0);
    }
    let stages = stage_estimates(opts, schedule, rank);
    let largest = stages.iter().map(|s| s.0).fold(0.0, f64::max);
    let params: f64 = stages.iter().map(|s| s.1).sum();
    (largest, 8.0 * params)
}

/// The optimizer's moments and the gradients global rank `rank` will write in training:
/// allocated untouched, they take memory only then. The first replica's gradients are
/// already written by the memory measurement (it restores them from a copy), so they are in
/// the free memory read after it.
pub(crate) fn state_bytes(opts: &SessionOptions, schedule: &Schedule, rank: usize) -> f64 {
    let params: f64 = (stage_estimates(opts, schedule, rank).iter())
        .map(|s| s.1)
        .sum();
    let grads = if rank < schedule.ranks { 0.0 } else { 4.0 };
    (BYTES_PER_PARAMETER - 8.0 + grads) * params
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(machine: &str, available: Option<u64>, activations: f64) -> Reading {
        Reading {
            machine: machine.into(),
            host: machine.into(),
            available,
            cgroup: None,
            activations,
            state: 0.0,
        }
    }

    #[test]
    fn the_ranks_of_a_machine_share_its_memory() {
        const GIB: u64 = 1 << 30;
        let g = GIB as f64;
        let limit = Remedy::Limit(1.0);
        // Two ranks of 6 GiB each fit in 16 GiB; three do not.
        let two = vec![reading("a", Some(16 * GIB), 6.0 * g); 2];
        assert_eq!(check_fits(&two, "the plan's peak", limit), Ok(()));
        let three = vec![reading("a", Some(16 * GIB), 6.0 * g); 3];
        let e = check_fits(&three, "the plan's peak", limit).unwrap_err();
        assert!(
            e.contains("the plan's peak takes 18.00 GiB of activations"),
            "{e}"
        );
        assert!(
            e.contains("3 ranks of machine a, which has 16.00 GiB free"),
            "{e}"
        );
        assert!(e.contains("give a limit (e.g. --mem-limit 4.2GiB"), "{e}");
        // The user's limit was too large: a lower one.
        let e = check_fits(&three, "the plan's peak", Remedy::LowerLimit(1.0)).unwrap_err();
        assert!(
            e.contains("lower the limit (e.g. --mem-limit 4.2GiB"),
            "{e}"
        );
        // A limit below one microbatch would not help: say what would.
        let e = check_fits(&three, "the plan's peak", Remedy::Limit(5.0 * g)).unwrap_err();
        assert!(
            e.contains("use a smaller microbatch") && !e.contains("--mem-limit"),
            "{e}"
        );
        // Optimizer state counts, and no limit makes room for it.
        let mut state = two.clone();
        state[0].state = 3.0 * g;
        state[1].state = 3.0 * g;
        let e = check_fits(&state, "the plan's peak", limit).unwrap_err();
        assert!(
            e.contains("and 6.00 GiB of optimizer state and gradients"),
            "{e}"
        );
        assert!(e.contains("--mem-limit 4.0GiB"), "{e}");
        // On two machines, each judged by its own ranks; the smallest reading counts.
        let two_machines = [
            reading("a", Some(16 * GIB), 6.0 * g),
            reading("b", Some(16 * GIB), 6.0 * g),
            reading("a", Some(16 * GIB), 6.0 * g),
            reading("b", Some(11 * GIB), 6.0 * g),
        ];
        let e = check_fits(&two_machines, "x", limit).unwrap_err();
        assert!(
            e.contains("2 ranks of machine b, which has 11.00 GiB free"),
            "{e}"
        );
        // A container's limit is named, so the user knows which memory ran short.
        let in_box = |id: &str, r: &Reading| Reading {
            available: Some(100 * GIB),
            cgroup: Some(CgroupReading {
                id: id.into(),
                headroom: 16 * GIB,
                limit: 20 * GIB,
            }),
            ..r.clone()
        };
        let boxed: Vec<Reading> = three.iter().map(|r| in_box("c", r)).collect();
        let e = check_fits(&boxed, "x", limit).unwrap_err();
        assert!(
            e.contains("3 ranks of machine a, which has 16.00 GiB free under its memory cgroup's limit of 20.00 GiB"),
            "{e}"
        );
        // Two containers on one machine: each fits its own limit, and together they must
        // still fit the machine.
        let two_boxes = [in_box("c", &three[0]), in_box("d", &three[1])];
        assert_eq!(check_fits(&two_boxes, "x", limit), Ok(()));
        let mut tight_host = two_boxes.clone();
        tight_host[1].available = Some(11 * GIB);
        let e = check_fits(&tight_host, "x", limit).unwrap_err();
        assert!(
            e.contains("2 ranks of machine a, which has 11.00 GiB free:"),
            "{e}"
        );
        // Unreadable memory is not judged.
        assert_eq!(check_fits(&[reading("", None, 1e30)], "x", limit), Ok(()));
        assert_eq!(suggested_limit(300.5 * (1u64 << 20) as f64), "300MiB");
        assert_eq!(suggested_limit(40000.0), "39KiB");
    }

    /// Each rank may plan on four fifths of its share of what is free after the optimizer
    /// state, in its container and on its machine, whichever is less.
    #[test]
    fn budgets_are_the_least_share_of_each_ranks_memory() {
        let mut boxed = reading("a", Some(3000), 0.0);
        boxed.cgroup = Some(CgroupReading {
            id: "c".into(),
            headroom: 1000,
            limit: 2000,
        });
        boxed.state = 100.0;
        let mut loose = reading("a", Some(3000), 0.0);
        loose.state = 100.0;
        let unknown = reading("b", None, 0.0);
        let budgets = activation_budgets(&[boxed.clone(), boxed, loose, unknown]);
        // The container: 0.8 × (1000 − 2 × 100) / 2; the machine: 0.8 × (3000 − 300) / 3.
        let want = [Some(320.0), Some(320.0), Some(720.0), None];
        for (b, w) in budgets.iter().zip(want) {
            assert_eq!(b.map(|b| (b * 1e6).round() / 1e6), w, "{budgets:?}");
        }
        // More state than memory leaves nothing, never a negative budget.
        let mut full = reading("a", Some(100), 0.0);
        full.state = 200.0;
        assert_eq!(activation_budgets(&[full]), vec![Some(0.0)]);
    }

    /// Options for `model` on `schedule`'s ranks, `dp` replicas, real compute.
    fn options(model: GptConfig, schedule: &Schedule, dp: usize) -> SessionOptions {
        use crate::run::{Compute, RunConfig};
        use nobubble_schedule::{MemLimit, Objective, ScheduleKind};
        SessionOptions {
            run: RunConfig {
                model,
                train: nobubble_nn::TrainConfig::default(),
                layout: nobubble_nn::StageLayout::Even,
                compute: Compute::Real,
                recv_timeout: std::time::Duration::from_secs(30),
                fault: None,
                post_validate: None,
                data_parallel: dp,
            },
            kind: ScheduleKind::ZbH1,
            file: Some(schedule.clone()),
            ranks: schedule.ranks,
            chunks: 2,
            mem_limit: MemLimit::None,
            emulated: None,
            collective_ms: 0.0,
            objective: Objective::Span,
            plans: Default::default(),
        }
    }

    /// The estimates a rank's checks use, against the stages the runtime builds: each
    /// rank's parameters counted from the real tensors on linear, V and interleaved
    /// placements (embedding and head on one rank in a V), once per replica; the
    /// measurement on the first replica only, its microbatch the largest of the rank's
    /// stages as the stage itself measures it.
    #[test]
    fn estimates_match_the_built_stages_on_every_placement_and_replica() {
        use nobubble_schedule::{generate, CostSpec, RankCost, Request, ScheduleKind};
        let shapes = [
            (ScheduleKind::ZbH1, 3, 1),
            (ScheduleKind::ZbV, 2, 1),
            (ScheduleKind::ZbV, 3, 1),
            (ScheduleKind::InterleavedZb, 2, 2),
        ];
        use nobubble_nn::config::Arch;
        let models = [
            GptConfig::micro(),
            GptConfig::small(),
            GptConfig::tiny().with_arch(Arch::Llama),
            GptConfig {
                ffn_hidden: Some(96),
                tie_embeddings: true,
                ..GptConfig::micro()
            },
        ]
        .map(|m| GptConfig { layers: 6, ..m });
        for (model, (kind, p, chunks)) in models.iter().flat_map(|m| shapes.map(|s| (m, s))) {
            let mut req = Request::new(kind, p, 4);
            req.chunks = chunks;
            let schedule = generate(&req, &CostSpec::uniform(RankCost::default(), 0.0)).unwrap();
            let counts = nobubble_nn::config::block_counts(
                model.layers,
                schedule.stages,
                &nobubble_nn::StageLayout::Even,
            )
            .unwrap();
            let mut stages = nobubble_nn::build_stages(model, 1, &counts).unwrap();
            let params: Vec<f64> = (stages.iter())
                .map(|s| s.params().iter().map(|p| p.value.len()).sum::<usize>() as f64)
                .collect();
            let measured: Vec<f64> = (stages.iter_mut())
                .map(|s| s.measure_memory().unwrap().total.after_forward as f64)
                .collect();
            for dp in [1, 2] {
                let opts = options(model.clone(), &schedule, dp);
                let mut total_state = 0.0;
                for r in 0..p * dp {
                    let own = schedule.stages_of(r % p);
                    let own_params: f64 = own.iter().map(|&s| params[s]).sum();
                    // The first replica's gradients are written by the measurement.
                    let state = state_bytes(&opts, &schedule, r);
                    let per = if r < p { 8.0 } else { 12.0 };
                    assert_eq!(state, per * own_params, "{kind:?} p {p} dp {dp} rank {r}");
                    total_state += state;
                    let (act, grads) = measurement_bytes(&opts, &schedule, r);
                    if r >= p {
                        assert_eq!((act, grads), (0.0, 0.0), "replica {}", r / p);
                        continue;
                    }
                    assert_eq!(grads, 8.0 * own_params);
                    let largest = own.iter().map(|&s| measured[s]).fold(0.0, f64::max);
                    // Exact: below, a run the check passes could be killed; above, runs
                    // that fit would be refused.
                    assert!(
                        act == largest,
                        "{kind:?} p {p} h {} rank {r}: estimated {act} bytes, the stage holds \
                         {largest}",
                        model.hidden
                    );
                }
                let whole = params.iter().sum::<f64>();
                assert_eq!(total_state, whole * (8.0 + 12.0 * (dp - 1) as f64));
            }
        }
    }

    #[test]
    fn this_machine_reads_its_free_memory() {
        let here = Reading::here(1.0, 0.0);
        assert!(!here.machine.is_empty());
        let free = here.available.expect("Linux has MemAvailable");
        assert!(free > 1 << 20, "{free}");
    }
}
