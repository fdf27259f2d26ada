"""Type stubs of the Rust extension module (crates/nobubble-py)."""

from collections.abc import Sequence
from typing import Literal

__version__: str

Cost = tuple[float, float, float] | tuple[float, float, float, float] | Sequence[Sequence[float]]
"""``(F, I, W)`` for every stage, or one such entry per stage in model order; a fourth
number is the fused backward's time B where it is not I + W (``None`` there: it is). With
one entry per rank on a schedule of more stages (V, interleaved), entry ``k`` is the model's
``k``-th slice, split evenly into consecutive chunks: on a V, entry 1 prices chunks 2 and 3,
which run on ranks 2 and p − 3, not rank 1 (give one entry per chunk for a slow device)."""

Mem = tuple[float, float] | Sequence[Sequence[float]]
"""``(M_B, M_W)`` for every stage, or one such entry per stage, read as ``Cost`` is."""

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
    def busy(self) -> list[float]:
        """Each rank's time running passes."""
    @property
    def idle(self) -> list[float]:
        """Each rank's idle time within its span (span − busy)."""
    @property
    def messages(self) -> int:
        """Transfers between ranks in one iteration."""
    @property
    def timeline(self) -> list[list[tuple[str, float, float]]]:
        """Per rank, each action's ``(action, start, end)`` as simulated, in program order."""
    @property
    def critical_path(self) -> list[str]:
        """The actions whose chain of waits sets the makespan, first to last."""
    @property
    def peak_memory(self) -> list[float]: ...
    @property
    def lower_bound(self) -> float: ...
    @property
    def span_lower_bound(self) -> float: ...
    @property
    def objective(self) -> Literal["span", "makespan"] | None: ...
    @property
    def mem_limit(self) -> str:
        """The memory limit as requested (``"none"``, ``"8"``, ``"20MiB"``, ...)."""
    @property
    def limit(self) -> float | None:
        """The limit the plan was made under, in multiples of M_B: for ``zb-auto``,
        ``zb-paper`` and ``v-auto`` the request's multiple, or their default when none was
        given (2p, p); for a schedule with a level of its own (``v-min``, ``v-half``,
        ``zb-v``, ``zb-1p``, ``zb-2p``) that level, whatever the request (which ``fits``
        checks); under budgets in bytes, the one multiple the ranks' shares work out to (the
        default if M_B is 0); for other schedules the request's multiple; ``None``: none."""
    @property
    def fits(self) -> bool:
        """Always ``True`` for a plan ``plan``/``check``/``simulate`` return: they raise
        :class:`ScheduleError` for a schedule over its limit."""
    @property
    def layer_split(self) -> list[int] | None: ...
    @property
    def stage_costs(self) -> list[tuple[float, ...]]:
        """Per stage ``(F, I, W)``, or ``(F, I, W, B)`` where B has a time of its own."""
    def to_csv(self) -> str: ...
    def to_chrome_trace(self) -> str: ...
    def to_svg(self) -> str: ...
    def measured_svg(
        self,
        measured: Sequence[Sequence[tuple[str, float, float]]],
        title: str = "measured",
        plan_title: str = "planned",
    ) -> str:
        """A measured timeline (per rank, ``(action, start, end)`` in ms, as ``timeline`` gives
        them; each one of that rank's actions in this plan) drawn above this plan's, on one
        time scale (the axis reads ms: plan on costs in ms)."""
    def _repr_svg_(self) -> str | None: ...
    def __eq__(self, other: object) -> bool:
        """Equal schedules, costs, limits, objective and layer split. Plans also hash,
        pickle and deep-copy."""
    def __hash__(self) -> int: ...

def plan(
    schedule: str,
    stages: int,
    microbatches: int,
    *,
    cost: Cost | None = None,
    comm: float | None = None,
    mem: Mem | None = None,
    mem_limit: MemLimit = None,
    placement: Literal["auto", "linear", "v"] = "auto",
    objective: Literal["span", "makespan"] = "span",
    chunks: int | None = None,
    layer_costs: str | None = None,
) -> Plan:
    """Plans ``schedule`` (a nobubble name or a PyTorch class name such as
    ``"ScheduleZBVZeroBubble"``) for ``stages`` ranks and ``microbatches`` microbatches.

    Costs default to F = I = W = 1, M_B = 1, M_W = 0.5, comm 0. ``layer_costs`` takes the
    JSON text of ``nobubble plan --layer-costs`` (times, memory and comm of every layer, so
    ``cost``/``mem``/``comm`` are refused beside it) and also chooses the blocks per stage.
    ``chunks`` (model chunks per rank) is for the interleaved schedules (default 2); for
    zb-auto, 1 means the linear placement and 2 the V one. ``placement`` is zb-auto's choice
    (another schedule accepts only its own layout). Raises
    :class:`ScheduleError` (a ``ValueError``) naming the setting at fault. Other Python
    threads run while it plans, and Ctrl-C interrupts a long plan at once.
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
