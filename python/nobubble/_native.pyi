"""Type stubs of the Rust extension module (crates/nobubble-py)."""

from collections.abc import Sequence
from typing import Literal

__version__: str

Cost = tuple[float, float, float] | Sequence[Sequence[float]]
"""``(F, I, W)`` for every stage, or one such entry per stage (or per rank)."""

Mem = tuple[float, float] | Sequence[Sequence[float]]
"""``(M_B, M_W)`` for every stage, or one such entry per stage (or per rank)."""

MemLimit = float | int | str | Sequence[str] | None
"""``None``; a number, always a multiple of each rank's M_B; a size with a unit
(``"20GiB"``, ``"1609728B"``); or a list of sizes, one per rank."""

class ScheduleError(ValueError):
    """A request the planner refuses, or a schedule that breaks a rule."""

class Plan:
    """A planned schedule: actions per rank in PyTorch's notation, and its simulation."""

    @property
    def schedule(self) -> str: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def num_stages(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    @property
    def placement(self) -> list[int]: ...
    @property
    def placement_kind(self) -> Literal["linear", "v"] | None: ...
    @property
    def actions(self) -> list[list[str]]: ...
    def stages_of(self, rank: int) -> list[int]: ...
    def rank_of(self, stage: int) -> int: ...
    @property
    def makespan(self) -> float: ...
    @property
    def bubble_rate(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def span(self) -> list[float]: ...
    @property
    def peak_memory(self) -> list[float]: ...
    @property
    def lower_bound(self) -> float: ...
    @property
    def span_lower_bound(self) -> float: ...
    @property
    def objective(self) -> Literal["span", "makespan"] | None: ...
    @property
    def mem_limit(self) -> str: ...
    @property
    def fits(self) -> bool: ...
    @property
    def layer_split(self) -> list[int] | None: ...
    @property
    def stage_costs(self) -> list[tuple[float, float, float]]: ...
    def to_csv(self) -> str: ...
    def to_chrome_trace(self) -> str: ...
    def to_svg(self) -> str: ...
    def _repr_svg_(self) -> str | None: ...

def plan(
    schedule: str,
    stages: int,
    microbatches: int,
    *,
    cost: Cost | None = None,
    comm: float = 0.0,
    mem: Mem | None = None,
    mem_limit: MemLimit = None,
    placement: Literal["auto", "linear", "v"] = "auto",
    objective: Literal["span", "makespan"] = "span",
    chunks: int | None = None,
    layer_costs: str | None = None,
) -> Plan:
    """Plans ``schedule`` (a nobubble name or a PyTorch class name such as
    ``"ScheduleZBVZeroBubble"``) for ``stages`` ranks and ``microbatches`` microbatches.

    Costs default to F = I = W = 1, M_B = 1, M_W = 0.5. ``layer_costs`` takes the JSON text
    of ``nobubble plan --layer-costs`` and also chooses the blocks per stage. ``chunks``
    (model chunks per rank) is for the interleaved schedules (default 2); ``placement`` is
    zb-auto's choice (another schedule accepts only its own layout). Raises
    :class:`ScheduleError` (a ``ValueError``) naming the setting at fault.
    """

def check(
    csv: str,
    *,
    cost: Cost | None = None,
    comm: float = 0.0,
    mem: Mem | None = None,
    mem_limit: MemLimit = None,
    name: str = "custom",
) -> Plan:
    """Validates PyTorch's compute-only schedule CSV; raises :class:`ScheduleError` naming the
    rank and action at fault."""

def simulate(
    actions: Sequence[Sequence[str]],
    *,
    cost: Cost | None = None,
    comm: float = 0.0,
    mem: Mem | None = None,
    mem_limit: MemLimit = None,
    name: str = "custom",
) -> Plan:
    """Simulates per-rank action lists (``[["0F0", "0I0", "0W0"], ...]``)."""

def schedules() -> list[tuple[str, str]]:
    """Every schedule name with its one-line summary."""

def schedule_names() -> list[tuple[str, list[str]]]:
    """Every schedule name with the other names ``plan`` accepts for it (PyTorch's class
    names such as ``"ScheduleZBVZeroBubble"``, other systems' spellings)."""
