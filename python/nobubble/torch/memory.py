"""Activation memory measured the way the planner counts it.

The planner's M_B is what one microbatch's forward leaves alive for its backward, and M_W
what is still alive after its input-gradient pass. On a GPU the caching allocator tells
that directly; on a CPU there is no allocator to ask, so we count what autograd saves:
every tensor packed by ``torch.autograd.graph.saved_tensors_hooks``, deduplicated by
storage (views share one), parameters excluded (they are not activations), alive until the
graph node that holds it is freed. The same tracker measures the profile and, around real
steps, each rank's peak, so planned and measured memory are the same quantity.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

import torch


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (str(tensor.device), storage.data_ptr())


@dataclass
class _Live:
    count: int
    nbytes: int


class _Packed:
    """What the autograd graph holds instead of the tensor: frees its count when dropped."""

    __slots__ = ("__weakref__", "key", "tensor", "tracker")

    def __init__(self, tracker: ActivationMemoryTracker, tensor: torch.Tensor, key) -> None:
        self.tracker = tracker
        self.tensor = tensor
        self.key = key

    def __del__(self) -> None:
        if self.key is not None:
            self.tracker._release(self.key)


@dataclass
class ActivationMemoryTracker:
    """Counts live saved-for-backward bytes (unique storages, parameters excluded).

    Use as a context manager around forwards (and the backwards that free them)::

        tracker = ActivationMemoryTracker(exclude=model.parameters())
        with tracker:
            schedule.step(x, target=y)
        tracker.peak_bytes

    Tensors saved while the context is active stay counted until autograd frees them, even
    after the context exits. ``peak_bytes`` is the largest ``live_bytes`` seen since the
    last ``reset_peak()``.
    """

    exclude: Iterable[torch.Tensor] = ()
    live_bytes: int = 0
    peak_bytes: int = 0
    _live: dict[tuple[str, int], _Live] = field(default_factory=dict)
    _excluded: set[tuple[str, int]] = field(default_factory=set)
    _hooks: object | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for tensor in self.exclude:
            key = _storage_key(tensor.detach())
            if key is not None:
                self._excluded.add(key)
        self.exclude = ()

    def reset_peak(self) -> None:
        """Starts a new peak from what is alive now."""
        self.peak_bytes = self.live_bytes

    def _pack(self, tensor: torch.Tensor) -> _Packed:
        # Keep a detached alias: holding the tensor itself would keep its grad_fn, and for a
        # node's own saved output that is a reference cycle through C++ that never frees
        # (autograd re-attaches the graph on unpack).
        tensor = tensor.detach()
        key = _storage_key(tensor)
        if key is None or key in self._excluded:
            return _Packed(self, tensor, None)
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                nbytes = tensor.untyped_storage().nbytes()
                self._live[key] = _Live(1, nbytes)
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            else:
                entry.count += 1
        return _Packed(self, tensor, key)

    @staticmethod
    def _unpack(packed: _Packed) -> torch.Tensor:
        return packed.tensor

    def _release(self, key: tuple[str, int]) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry.count -= 1
            if entry.count == 0:
                del self._live[key]
                self.live_bytes -= entry.nbytes

    def __enter__(self) -> ActivationMemoryTracker:
        if self._hooks is not None:
            raise RuntimeError("ActivationMemoryTracker is already active; do not nest it")
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks = hooks
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hooks = self._hooks
        self._hooks = None
        if hooks is not None:
            hooks.__exit__(exc_type, exc, tb)  # type: ignore[attr-defined]


def format_bytes(nbytes: float) -> str:
    """Human-readable size in binary units (``12.50 MiB``)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")
