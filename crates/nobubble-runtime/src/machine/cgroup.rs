//! The memory a process's control groups still let it take.
//!
//! Why: in a container (Docker, Kubernetes, Slurm with cgroup limits) `MemAvailable` is the
//! host's, but the kernel kills the process when its cgroup reaches its own limit. So the
//! free memory a run is judged against is the smaller of the two. Both cgroup versions are
//! read: v2 (`memory.max`, `memory.current`) and v1 (`memory.limit_in_bytes`,
//! `memory.usage_in_bytes`), at the process's cgroup and every ancestor up to the mount
//! (each one's limit applies). Page cache (`active_file`, `inactive_file`) does not count as
//! used: the kernel reclaims it before it kills, as `MemAvailable` counts it free. Swap the
//! cgroup may use is not counted: a container allowed to swap is judged as if it could not
//! (refused, not slowed).

use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit" (cgroup v1 writes `i64::MAX` rounded to pages).
const UNLIMITED: u64 = 1 << 60;

/// The tightest cgroup's room: the bytes it still allows, and the cgroup's directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Headroom {
    pub bytes: u64,
    pub limit: u64,
    pub cgroup: PathBuf,
    /// The cgroup directory's inode: the cgroup's kernel id, the same in every namespace.
    pub inode: u64,
}

/// This process's headroom under its memory cgroups, or `None` where no limit applies or
/// none can be read.
pub fn headroom() -> Option<Headroom> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    headroom_under(Path::new("/sys/fs/cgroup"), &own)
}

/// [`headroom`] with the cgroup mount (`mount`, as `/sys/fs/cgroup`) and the contents of
/// `/proc/self/cgroup` given: the testable part.
pub fn headroom_under(mount: &Path, proc_self_cgroup: &str) -> Option<Headroom> {
    // v1 lines are `id:controllers:path`; the memory controller's line names the cgroup.
    // Without one, the v2 line `0::path` does (on a hybrid system v2 has no memory).
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        } else if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    let (root, path, version) = match (v1, v2) {
        (Some(p), _) => (mount.join("memory"), p, Version::V1),
        (None, Some(p)) => (mount.to_path_buf(), p, Version::V2),
        (None, None) => return None,
    };
    // Inside a container with its own cgroup namespace the mount's root is the process's
    // own cgroup, and the path printed may not exist under it: then the root is the cgroup.
    // A path outside the namespace's root is printed with `..`: the root is the cgroup then.
    let outside = Path::new(&path)
        .components()
        .any(|c| c == std::path::Component::ParentDir);
    let mut dir = root.join(path.trim_start_matches('/'));
    if outside || !dir.is_dir() {
        dir = root.clone();
    }
    let mut tightest: Option<Headroom> = None;
    loop {
        if let Some(h) = version.headroom(&dir) {
            if tightest.as_ref().is_none_or(|t| h.bytes < t.bytes) {
                tightest = Some(h);
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(&root) {
            break;
        }
    }
    tightest
}

#[derive(Clone, Copy)]
enum Version {
    V1,
    V2,
}

impl Version {
    /// One cgroup's limit less what it uses, if it has a limit.
    fn headroom(self, dir: &Path) -> Option<Headroom> {
        let number = |name: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (limit, usage, reclaimable) = match self {
            // `max` (no limit) does not parse.
            Version::V2 => (
                number("memory.max")?,
                number("memory.current")?,
                ["inactive_file", "active_file"],
            ),
            Version::V1 => (
                number("memory.limit_in_bytes")?,
                number("memory.usage_in_bytes")?,
                ["total_inactive_file", "total_active_file"],
            ),
        };
        if limit >= UNLIMITED {
            return None;
        }
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let cache: u64 = (stat.lines())
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                reclaimable
                    .contains(&k)
                    .then(|| v.trim().parse::<u64>().ok())?
            })
            .sum();
        let used = usage.saturating_sub(cache);
        use std::os::unix::fs::MetadataExt;
        Some(Headroom {
            bytes: limit.saturating_sub(used),
            limit,
            cgroup: dir.to_path_buf(),
            inode: std::fs::metadata(dir).map_or(0, |m| m.ino()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nobubble-cgroup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn cgroup_v2_limits_count_down_to_the_tightest_ancestor() {
        const MIB: u64 = 1 << 20;
        let mount = temp("v2");
        // The job's cgroup: 8 GiB limit, 3 GiB used of which 1 GiB reclaimable cache.
        let job = mount.join("slurm/job_7");
        write(
            &job,
            &[
                ("memory.max", &format!("{}\n", 8192 * MIB)),
                ("memory.current", &format!("{}\n", 3072 * MIB)),
                (
                    "memory.stat",
                    &format!("anon 1\ninactive_file {}\nfile 9\n", 1024 * MIB),
                ),
            ],
        );
        // Its parent: no limit of its own.
        write(
            &mount.join("slurm"),
            &[("memory.max", "max\n"), ("memory.current", "5\n")],
        );
        let cgroup = "0::/slurm/job_7\n";
        let h = headroom_under(&mount, cgroup).unwrap();
        assert_eq!(h.bytes, (8192 - 2048) * MIB);
        assert_eq!((h.limit, h.cgroup.clone()), (8192 * MIB, job.clone()));
        // A parent that allows less binds instead.
        write(
            &mount.join("slurm"),
            &[
                ("memory.max", &format!("{}", 4096 * MIB)),
                ("memory.current", &format!("{}", 3584 * MIB)),
            ],
        );
        let h = headroom_under(&mount, cgroup).unwrap();
        assert_eq!((h.bytes, h.cgroup), (512 * MIB, mount.join("slurm")));
        // Usage over the limit leaves nothing, not an underflow.
        write(
            &job,
            &[
                ("memory.current", &format!("{}", 9000 * MIB)),
                ("memory.stat", ""),
            ],
        );
        assert_eq!(headroom_under(&mount, cgroup).unwrap().bytes, 0);
        // Two cgroups are told apart by their directories' inodes (the job binds now).
        let ino = |d: &Path| std::fs::metadata(d).unwrap().ino();
        let h = headroom_under(&mount, cgroup).unwrap();
        assert_eq!(h.inode, ino(&job));
        assert_ne!(h.inode, ino(&mount.join("slurm")));
        // A cgroup outside the namespace's root is printed with `..`: the root is used,
        // never a directory outside the mount.
        write(
            &mount,
            &[
                ("memory.max", &format!("{}", 1024 * MIB)),
                ("memory.current", "0"),
            ],
        );
        let h = headroom_under(&mount, "0::/../../etc\n").unwrap();
        assert_eq!((h.bytes, h.cgroup), (1024 * MIB, mount.clone()));
        std::fs::remove_file(mount.join("memory.max")).unwrap();
        // No limit anywhere: no headroom to report.
        write(&job, &[("memory.max", "max")]);
        write(&mount.join("slurm"), &[("memory.max", "max")]);
        assert_eq!(headroom_under(&mount, cgroup), None);
        let _ = std::fs::remove_dir_all(&mount);
    }

    #[test]
    fn cgroup_v1_memory_controller_and_a_namespaced_container() {
        const MIB: u64 = 1 << 20;
        let mount = temp("v1");
        let own = mount.join("memory/docker/abc");
        write(
            &own,
            &[
                ("memory.limit_in_bytes", &format!("{}", 2048 * MIB)),
                ("memory.usage_in_bytes", &format!("{}", 1024 * MIB)),
                (
                    "memory.stat",
                    &format!("cache 5\ntotal_inactive_file {}\n", 256 * MIB),
                ),
            ],
        );
        // The root reports v1's "unlimited".
        write(
            &mount.join("memory"),
            &[
                ("memory.limit_in_bytes", "9223372036854771712"),
                ("memory.usage_in_bytes", "1"),
            ],
        );
        // A hybrid system: the v2 line is there too, the memory line wins.
        let cgroup = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        let h = headroom_under(&mount, cgroup).unwrap();
        assert_eq!((h.bytes, h.cgroup), ((2048 - 768) * MIB, own));
        // Inside the container's namespace the path names a cgroup the mount does not show:
        // the mount's root is the container's own cgroup.
        let inside = temp("v1-ns");
        write(
            &inside.join("memory"),
            &[
                ("memory.limit_in_bytes", &format!("{}", 100 * MIB)),
                ("memory.usage_in_bytes", "0"),
            ],
        );
        let h = headroom_under(&inside, "4:memory:/docker/abc\n").unwrap();
        assert_eq!(h.bytes, 100 * MIB);
        // Nothing readable: no answer rather than a guess.
        assert_eq!(headroom_under(&temp("none"), cgroup), None);
        assert_eq!(headroom_under(&mount, "garbage"), None);
        let _ = std::fs::remove_dir_all(&mount);
        let _ = std::fs::remove_dir_all(&inside);
    }
}
