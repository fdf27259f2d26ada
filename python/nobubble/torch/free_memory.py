"""Planning within the memory each rank's device has free, measured on every rank.

``mem_limit=FreeMemory()`` in :func:`~nobubble.torch.agreed_plan` (or ``PlannedSchedule``)
turns into one byte budget per rank when the plan is agreed: every rank reads what its
device has free, the readings are all-gathered with the profiles, and rank 0 plans within
them. The rule is ``nobubble train``'s when a plan would not fit: ranks that share a memory
(one GPU, one machine's RAM, one container's limit) share what it has free, and each may
plan on four fifths of its share, the rest left for what a plan's peak does not count (the
allocator's slack, a pass's temporaries).
"""

from __future__ import annotations

import math
import numbers
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

#: For tests, as in ``nobubble train``: a number of bytes here stands in for the free memory
#: of a CPU device (no memory cgroup is read then).
OVERRIDE_ENV = "NOBUBBLE_MEM_AVAILABLE"


@dataclass(frozen=True)
class MemoryReading:
    """What one rank read. Ranks with the same ``memory`` share it, and so do ranks with the
    same ``cgroup``."""

    #: Which memory: a GPU (its UUID), or a machine's RAM (its kernel's boot id).
    memory: str
    #: Bytes free on it.
    free: int
    #: Where, for messages (host and device).
    label: str
    #: The memory cgroup (a container's) that limits this rank on a CPU, if any.
    cgroup: str | None = None
    #: Bytes that cgroup still allows.
    cgroup_free: int | None = None


@dataclass(frozen=True)
class FreeMemory:
    """Plan within what each rank's device has free (``mem_limit=FreeMemory()``).

    Each rank may plan on ``fraction`` × (its share of the free bytes − ``reserve``); ranks
    that compute on the same memory share it (one GPU, a machine's RAM, a container's limit:
    the least share counts). Free is, on CUDA, the driver's free memory plus what PyTorch's
    caching allocator holds unused; on a CPU, ``MemAvailable`` and the headroom of the
    process's memory cgroup. ``device``: where this rank computes (default: the current CUDA
    device if CUDA is initialised, else the CPU; call ``torch.cuda.set_device`` or give it).
    Measure once the model is on its device; ``reserve`` is what each rank will still
    allocate outside activations: AdamW's two moments (2 × the stage's parameter bytes,
    allocated by the first ``opt.step()``) and the gradients if they do not exist yet
    (1 × more), in bytes or as a size (``"1GiB"``; read into bytes).
    """

    fraction: float = 0.8
    reserve: int | str = 0
    device: str | torch.device | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, numbers.Real):
            raise TypeError(
                f"FreeMemory(fraction={self.fraction!r}): give a number, e.g. 0.8 (not a string)"
            )
        # A size with a unit reads as the `mem_limit` strings do ("1GiB").
        object.__setattr__(self, "reserve", _reserve_bytes(self.reserve))
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

    def read(self) -> MemoryReading:
        """This rank's reading of the memory it computes on."""
        device = torch.device(self.device) if self.device is not None else _default_device()
        host = socket.gethostname()
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            free, _total = torch.cuda.mem_get_info(index)
            cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
            memory = f"gpu {uuid}" if uuid is not None else f"{_boot_id()}/cuda:{index}"
            return MemoryReading(memory, int(free + max(cached, 0)), f"{host} cuda:{index}")
        if device.type != "cpu":
            raise ValueError(
                f"FreeMemory reads CUDA and CPU memory, not {device.type}: give mem_limit in "
                "bytes (e.g. '20GiB') for this device"
            )
        override = os.environ.get(OVERRIDE_ENV)
        if override is not None:
            try:
                return MemoryReading(f"{_boot_id()}/ram", int(override), f"{host} CPU")
            except ValueError:
                raise ValueError(f"{OVERRIDE_ENV}={override!r}: give a number of bytes") from None
        available = _mem_available()
        if available is None:
            raise ValueError(
                "FreeMemory cannot read this machine's free memory (no /proc/meminfo): give "
                "mem_limit in bytes (e.g. '20GiB')"
            )
        tightest = min(_cgroup_headrooms(), default=None, key=lambda c: c[1])
        return MemoryReading(
            f"{_boot_id()}/ram",
            available,
            f"{host} CPU",
            cgroup=None if tightest is None else f"{_boot_id()}:{tightest[0]}",
            cgroup_free=None if tightest is None else tightest[1],
        )

    def budgets(self, readings: Sequence[MemoryReading]) -> list[str]:
        """One ``mem_limit`` entry per rank (``"…B"``) from every rank's :meth:`read`, in
        rank order: the least of its shares (of its memory, and of its cgroup's)."""
        shares: list[float | None] = [None] * len(readings)
        for ranks, free, what in _groups(readings):
            share = self.fraction * (free - len(ranks) * self.reserve) / len(ranks)
            if share <= 0:
                reserve = f", less than their reserve of {_size(self.reserve)} each"
                raise ValueError(
                    f"rank {ranks[0]} has {_size(free)} free on {what}, shared by "
                    f"{len(ranks)} rank(s){reserve if self.reserve else ''}: free memory "
                    "there, lower FreeMemory(reserve=…), or use more devices"
                )
            for r in ranks:
                shares[r] = share if shares[r] is None else min(shares[r], share)
        return [f"{int(s)}B" for s in shares if s is not None]

    def explain(self, readings: Sequence[MemoryReading]) -> str:
        """What each rank read, for an error about the budgets."""
        parts = []
        for r, reading in enumerate(readings):
            part = f"rank {r}: {_size(reading.free)} free on {reading.label}"
            if reading.cgroup_free is not None:
                part += f", {_size(reading.cgroup_free)} under its memory cgroup"
            parts.append(part)
        return (
            f"mem_limit=FreeMemory(fraction={self.fraction}, reserve={self.reserve}) read "
            + "; ".join(parts)
        )


def _groups(readings: Sequence[MemoryReading]) -> list[tuple[list[int], int, str]]:
    """Ranks sharing a memory, then ranks sharing a cgroup: (ranks, least free, what)."""
    out = []
    for key, free_of, what in (
        (lambda x: x.memory, lambda x: x.free, lambda x: x.label),
        (lambda x: x.cgroup, lambda x: x.cgroup_free, lambda x: f"{x.label}'s memory cgroup"),
    ):
        members: dict[str, list[int]] = {}
        for r, reading in enumerate(readings):
            if key(reading) is not None and free_of(reading) is not None:
                members.setdefault(key(reading), []).append(r)
        for ranks in members.values():
            least = min(free_of(readings[r]) for r in ranks)
            out.append((ranks, least, what(readings[ranks[0]])))
    return out


def _default_device() -> torch.device:
    """The device this process computes on: its current CUDA device, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _reserve_bytes(value: object) -> int:
    """``FreeMemory(reserve=…)`` in bytes: a whole number, or a size such as "1GiB"."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]+)\s*", value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(
                f"FreeMemory(reserve={value!r}): give bytes (an int) or a size with a unit, "
                "e.g. '1GiB' or '512MB'"
            )
        nbytes = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not math.isfinite(nbytes):
            raise ValueError(f"FreeMemory(reserve={value!r}): not a finite size")
        return int(nbytes)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(
            f"FreeMemory(reserve={value!r}): give bytes (an int) or a size such as '1GiB'"
        )
    return int(value)


def _size(nbytes: float) -> str:
    from nobubble.torch.memory import format_bytes

    return format_bytes(nbytes)


def _boot_id() -> str:
    """This machine's kernel boot id (ranks with the same one share its RAM); the host name
    where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


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
) -> list[tuple[int, int]]:
    """``(directory inode, headroom)`` of every memory cgroup with a limit on this process's
    path to the root (v2, or v1's memory controller): ``membership`` is
    ``/proc/self/cgroup``, and ``mount`` where the hierarchies are mounted."""
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
                out.append((here.stat().st_ino, headroom))
            if here == root:
                break
            here = here.parent
    return out


def _headroom(
    directory: Path, limit_file: str, usage_file: str, cache_keys: tuple[str, str]
) -> int | None:
    """``limit − (usage − page cache)`` of one cgroup directory; ``None`` without a limit
    or where it cannot be read."""
    try:
        limit_text = (directory / limit_file).read_text().strip()
        usage = int((directory / usage_file).read_text().strip())
        if limit_text == "max":
            return None
        limit = int(limit_text)
    except (OSError, ValueError):
        return None
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
