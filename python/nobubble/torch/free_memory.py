"""Planning within the memory each rank's device has free, measured on every rank.

``mem_limit=FreeMemory()`` in :func:`~nobubble.torch.agreed_plan` (or ``PlannedSchedule``)
turns into one byte budget per rank when the plan is agreed: every rank reads what its
device has free, the readings are all-gathered with the profiles, and rank 0 plans within
them. The same rule as ``nobubble train`` uses when a plan would not fit: four fifths of
each rank's share, the rest left for what a plan's peak does not count (the allocator's
slack, a pass's temporaries).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

#: For tests, as in ``nobubble train``: a number of bytes here stands in for the free memory
#: of a CPU device (no memory cgroup is read then).
OVERRIDE_ENV = "NOBUBBLE_MEM_AVAILABLE"


@dataclass(frozen=True)
class FreeMemory:
    """Plan within what each rank's device has free (``mem_limit=FreeMemory()``).

    Each rank may plan on ``fraction`` × (its share of the free bytes − ``reserve``), where
    ranks that compute on the same memory (one GPU, or one host's CPU) share it. Free is, on
    CUDA, the driver's free memory plus what PyTorch's caching allocator holds unused; on a
    CPU, ``MemAvailable``, or less where the process's memory cgroup (a container's) allows
    less. Measure once the model is on its device; ``reserve`` is what each rank will still
    allocate outside activations: AdamW's two moments (2 × the stage's parameter bytes,
    allocated by the first ``opt.step()``) and the gradients if they do not exist yet
    (1 × more).
    """

    fraction: float = 0.8
    reserve: int = 0
    device: str | torch.device | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(
                f"FreeMemory(fraction={self.fraction}): give the share of the free memory to "
                "plan on, above 0 and at most 1 (default 0.8)"
            )
        if self.reserve < 0:
            raise ValueError(
                f"FreeMemory(reserve={self.reserve}): give the bytes each rank will still "
                "allocate outside activations, 0 or more"
            )

    def read(self) -> tuple[str, int]:
        """This rank's reading: which memory (host and device, so that ranks sharing it
        divide it) and how many bytes it has free."""
        device = torch.device(self.device) if self.device is not None else _default_device()
        host = socket.gethostname()
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            free, _total = torch.cuda.mem_get_info(index)
            cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
            return f"{host}/cuda:{index}", int(free + max(cached, 0))
        if device.type != "cpu":
            raise ValueError(
                f"FreeMemory reads CUDA and CPU memory, not {device.type}: give mem_limit in "
                "bytes (e.g. '20GiB') for this device"
            )
        free = host_free_bytes()
        if free is None:
            raise ValueError(
                "FreeMemory cannot read this machine's free memory (no /proc/meminfo): give "
                "mem_limit in bytes (e.g. '20GiB')"
            )
        return f"{host}/cpu", free

    def budgets(self, readings: Sequence[tuple[str, int]]) -> list[str]:
        """One ``mem_limit`` entry per rank (``"…B"``) from every rank's :meth:`read`, in
        rank order."""
        sharing: dict[str, list[int]] = {}
        for rank, (where, _free) in enumerate(readings):
            sharing.setdefault(where, []).append(rank)
        out: list[str] = []
        for rank, (where, _free) in enumerate(readings):
            ranks = sharing[where]
            free = min(readings[r][1] for r in ranks)
            share = self.fraction * (free - len(ranks) * self.reserve) / len(ranks)
            if share <= 0:
                raise ValueError(
                    f"rank {rank} has {_size(free)} free on {where}, shared by "
                    f"{len(ranks)} rank(s), less than their reserve of {_size(self.reserve)} "
                    "each: free memory on that device, lower FreeMemory(reserve=…), or use "
                    "more devices"
                )
            out.append(f"{int(share)}B")
        return out

    def explain(self, readings: Sequence[tuple[str, int]]) -> str:
        """Where each rank's budget came from, for an error about it."""
        sharing: dict[str, int] = {}
        for where, _free in readings:
            sharing[where] = sharing.get(where, 0) + 1
        parts = [
            f"rank {r}: {_size(free)} free on {where}"
            + (f" for {sharing[where]} ranks" if sharing[where] > 1 else "")
            for r, (where, free) in enumerate(readings)
        ]
        return (
            f"mem_limit=FreeMemory(fraction={self.fraction}, reserve={self.reserve}) read "
            + "; ".join(parts)
        )


def _default_device() -> torch.device:
    """The device this process computes on: its current CUDA device, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _size(nbytes: float) -> str:
    from nobubble.torch.memory import format_bytes

    return format_bytes(nbytes)


def host_free_bytes() -> int | None:
    """What this process may still allocate on the host: ``MemAvailable``, or its memory
    cgroup's headroom where that is less (the tightest of its cgroup and their ancestors;
    page cache counts as free, as in ``MemAvailable``). ``None`` where nothing can be read."""
    override = os.environ.get(OVERRIDE_ENV)
    if override is not None:
        try:
            return int(override)
        except ValueError:
            raise ValueError(f"{OVERRIDE_ENV}={override!r}: give a number of bytes") from None
    free = _mem_available()
    for headroom in _cgroup_headrooms():
        free = headroom if free is None else min(free, headroom)
    return free


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headrooms(
    membership: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")
) -> list[int]:
    """The headroom of every memory cgroup with a limit on this process's path to the root
    (v2, or v1's memory controller): ``membership`` is ``/proc/self/cgroup``'s text, and
    ``mount`` where the hierarchies are mounted."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if controllers == "":
            root = mount
            files = ("memory.max", "memory.current", ("inactive_file", "active_file"))
        elif "memory" in controllers.split(","):
            root = mount / "memory"
            files = (
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                ("total_inactive_file", "total_active_file"),
            )
        else:
            continue
        here = root / path.lstrip("/")
        if ".." in Path(path).parts or not here.is_dir():
            here = root  # a namespaced container: its root is its own cgroup
        while True:
            headroom = _headroom(here, *files)
            if headroom is not None:
                out.append(headroom)
            if here == root:
                break
            here = here.parent
    return out


def _headroom(
    directory: Path, limit_file: str, usage_file: str, cache_keys: tuple[str, str]
) -> int | None:
    """``limit − (usage − page cache)`` of one cgroup directory; ``None`` without a limit."""
    try:
        limit_text = (directory / limit_file).read_text().strip()
        usage = int((directory / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit_text == "max":
        return None
    limit = int(limit_text)
    if limit >= 1 << 60:  # v1's "no limit" is the largest page-aligned value
        return None
    cache = 0
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in cache_keys:
                cache += int(value)
    except (OSError, ValueError):
        pass
    return max(limit - max(usage - cache, 0), 0)
