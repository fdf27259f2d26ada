"""``FreeMemory``: the budgets it gives, how it reads free memory, and planning within it."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import nobubble  # noqa: E402
import nobubble.torch as nbt  # noqa: E402
from nobubble.torch.free_memory import (  # noqa: E402
    OVERRIDE_ENV,
    MemoryReading,
    _cgroup_headrooms,
)
from nobubble.torch.models import (  # noqa: E402
    SAMPLE_TEXT,
    GPTConfig,
    byte_batches,
    gpt_chunks,
    lm_loss,
)

MIB = 1 << 20


def test_ranks_sharing_a_memory_share_it() -> None:
    """Ranks on one machine's RAM split it; a GPU of its own is a rank's alone; the least
    reading of a shared memory counts; each rank's reserve comes off first."""
    readings = [
        MemoryReading("boot-a/ram", 1000 * MIB, "a CPU"),
        MemoryReading("boot-a/ram", 900 * MIB, "a CPU"),
        MemoryReading("gpu 1", 500 * MIB, "b cuda:0"),
    ]
    budgets = nbt.FreeMemory(fraction=0.5, reserve=100 * MIB).budgets(readings)
    # boot-a: 0.5 × (900 − 2 × 100) MiB / 2; gpu 1: 0.5 × (500 − 100) MiB.
    assert budgets == [f"{175 * MIB}B", f"{175 * MIB}B", f"{200 * MIB}B"]
    assert nbt.FreeMemory().budgets([MemoryReading("m", 1000, "")]) == ["800B"]


def test_containers_share_their_own_limit_and_together_their_machine() -> None:
    """Two containers on one machine: each rank gets the lesser of its container's share and
    its share of the machine, as `nobubble train` judges them."""
    readings = [
        MemoryReading("boot/ram", 1000 * MIB, "h CPU", cgroup="c1", cgroup_free=300 * MIB),
        MemoryReading("boot/ram", 1000 * MIB, "h CPU", cgroup="c2", cgroup_free=800 * MIB),
    ]
    # c1: 0.8 × 300; c2: 0.8 × 800 = 640, but the machine's share is 0.8 × 1000 / 2 = 400.
    assert nbt.FreeMemory().budgets(readings) == [f"{240 * MIB}B", f"{400 * MIB}B"]


def test_bad_settings_and_too_little_memory_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"fraction=0.*above 0 and at most 1"):
        nbt.FreeMemory(fraction=0)
    with pytest.raises(ValueError, match=r"reserve=-1.*0 or more"):
        nbt.FreeMemory(reserve=-1)
    small = [MemoryReading("a", 10 * MIB, "a CPU"), MemoryReading("b", MIB, "b CPU")]
    with pytest.raises(ValueError, match=r"rank 1 has 1.00 MiB free on b CPU.*reserve of 2.00"):
        nbt.FreeMemory(reserve=2 * MIB).budgets(small)
    full = [MemoryReading("a", 0, "a CPU")]
    with pytest.raises(ValueError, match=r"has 0 B free on a CPU, shared by 1 rank\(s\): free"):
        nbt.FreeMemory().budgets(full)
    with pytest.raises(ValueError, match="reads CUDA and CPU memory, not meta"):
        nbt.FreeMemory(device="meta").read()


def test_cpu_reading_and_its_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OVERRIDE_ENV, "123456")
    reading = nbt.FreeMemory(device="cpu").read()
    assert reading.free == 123456 and reading.cgroup is None
    assert reading.memory.endswith("/ram") and reading.label.endswith("CPU")
    monkeypatch.setenv(OVERRIDE_ENV, "lots")
    with pytest.raises(ValueError, match="give a number of bytes"):
        nbt.FreeMemory(device="cpu").read()
    monkeypatch.delenv(OVERRIDE_ENV)
    reading = nbt.FreeMemory(device="cpu").read()
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        line = next(x for x in meminfo.read_text().splitlines() if x.startswith("MemAvailable"))
        # MemAvailable itself, read a moment apart: allow 64 MiB of drift.
        assert abs(reading.free - int(line.split()[1]) * 1024) <= 64 * MIB
    assert reading.cgroup_free is None or reading.cgroup_free >= 0


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


def test_cgroup_v2_counts_every_limited_ancestor_and_not_the_page_cache(tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    _write(mount, {"memory.max": "max", "memory.current": "5"})
    _write(mount / "pod", {"memory.max": str(1000 * MIB), "memory.current": str(900 * MIB)})
    box = mount / "pod" / "box"
    _write(
        box,
        {
            "memory.max": str(600 * MIB),
            "memory.current": str(500 * MIB),
            "memory.stat": f"anon 1\ninactive_file {200 * MIB}\nactive_file {100 * MIB}\nfile 9\n",
        },
    )
    membership = tmp_path / "cgroup"
    membership.write_text("0::/pod/box\n")
    # box: 600 − (500 − 300) = 400 MiB; pod: 1000 − 900 = 100 MiB; the root has no limit.
    headrooms = _cgroup_headrooms(membership, mount)
    assert sorted(h for _inode, h in headrooms) == [100 * MIB, 400 * MIB]
    assert {i for i, _h in headrooms} == {box.stat().st_ino, (mount / "pod").stat().st_ino}
    # A namespaced container sees '..' in its path: its mount's root is its own cgroup.
    membership.write_text("0::/../../elsewhere\n")
    (mount / "memory.max").write_text(str(50 * MIB))
    assert _cgroup_headrooms(membership, mount) == [(mount.stat().st_ino, 50 * MIB - 5)]


def test_cgroup_v1_reads_the_memory_controller(tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    unlimited = str((1 << 63) - 4096)
    _write(mount / "memory", {"memory.limit_in_bytes": unlimited, "memory.usage_in_bytes": "1"})
    _write(
        mount / "memory" / "job",
        {
            "memory.limit_in_bytes": str(400 * MIB),
            "memory.usage_in_bytes": str(300 * MIB),
            "memory.stat": f"cache 5\ntotal_inactive_file {256 * MIB}\n",
        },
    )
    membership = tmp_path / "cgroup"
    membership.write_text("12:cpu,cpuacct:/job\n9:memory:/job\n0::/\n")
    # 400 − (300 − 256) = 356 MiB; v1's "no limit" and the absent v2 files count nothing.
    assert [h for _i, h in _cgroup_headrooms(membership, mount)] == [356 * MIB]


def test_one_rank_plans_within_its_budget_and_several_ranks_need_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rank runs its microbatches one after another (peak: one microbatch), so a budget
    of 1.5 microbatches plans and half of one is refused by the planner. (Where a budget
    binds a pipeline: ``test_torch_pipeline.test_free_memory_plans_within_each_ranks_share``.)"""
    cfg = GPTConfig(vocab=256, hidden=32, heads=2, blocks=2, seq_len=16)
    ((x, y),) = byte_batches(SAMPLE_TEXT, 2, cfg.seq_len, 1, seed=3)
    prof = nbt.profile(gpt_chunks(cfg, 2), (x, y), lm_loss, warmup=0, iterations=1)
    one_mb = sum(s.mem_b for s in prof.stages)  # both chunks on the one rank

    def plan_with_free(free: float) -> nbt.PlanSnapshot:
        monkeypatch.setenv(OVERRIDE_ENV, str(int(free)))
        return nbt.make_plan(
            "zb-auto", num_ranks=1, num_microbatches=8, costs=prof, mem_limit=nbt.FreeMemory()
        )

    free = int(1.5 * one_mb / 0.8)
    plan = plan_with_free(free)
    assert plan.inputs["mem_limit"] == [f"{int(0.8 * free)}B"]
    assert plan.peak_memory is not None and 0 < plan.peak_memory[0] <= 1.5 * one_mb
    with pytest.raises(ValueError) as refused:
        plan_with_free(0.5 * one_mb / 0.8)
    # The planner's reason, then where the budget came from.
    assert "below one microbatch's activations there" in str(refused.value)
    assert "(mem_limit=FreeMemory(fraction=0.8, reserve=0) read rank 0: " in str(refused.value)
    assert type(refused.value) is nobubble.ScheduleError
    with pytest.raises(ValueError, match="plan with agreed_plan on every rank"):
        nbt.make_plan(
            "zb-auto", num_ranks=2, num_microbatches=8, costs=prof, mem_limit=nbt.FreeMemory()
        )
