"""Plans as nobubble.torch sees them, and how all ranks come to hold the same one.

A plan is anything with the interface of ``nobubble.plan(...)``'s result (``actions``,
``stages_of``, ``num_ranks``, ...). PyTorch runs a schedule SPMD: every rank computes its
communication from every other rank's action list, so every rank must hold *the same*
plan. Planning is deterministic, but measured costs differ from rank to rank, so
:func:`agreed_plan` gathers the measurements, lets rank 0 plan, and broadcasts a
:class:`PlanSnapshot` (plain data, picklable) that every rank then uses.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union, runtime_checkable

import torch.distributed as dist

from nobubble.torch._compat import parse_action
from nobubble.torch.free_memory import FreeMemory, MemoryReading
from nobubble.torch.profiling import Profile, whole_number

#: ``nobubble.plan``'s ``mem_limit``: a number is a multiple of each rank's M_B; a size with
#: a unit (``"20GiB"``, ``"1609728B"``) or a list of sizes (one per rank) is a byte budget
#: when the costs' memory is in bytes, as a :class:`Profile`'s is. (``Union``: the alias is
#: evaluated at import.) :class:`FreeMemory` plans within what each rank's device has free.
MemLimit = Union[float, int, str, Sequence[Union[float, int, str]], FreeMemory, None]


@runtime_checkable
class PlanLike(Protocol):
    """The part of ``nobubble.plan``'s result that nobubble.torch uses."""

    @property
    def schedule(self) -> str: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def num_stages(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    @property
    def actions(self) -> list[list[str]]: ...
    def stages_of(self, rank: int) -> list[int]: ...
    def rank_of(self, stage: int) -> int: ...


@dataclass(frozen=True)
class PlanSnapshot:
    """A plan reduced to plain data: what every rank needs, picklable for a broadcast.

    ``makespan``, ``bubble_rate``, ``peak_memory`` and ``lower_bound`` are the planner's
    predictions, in the units of the costs it was given (ms and bytes when planned from a
    :class:`~nobubble.torch.Profile`); ``None`` when unknown (a plan read from a CSV file).
    ``inputs`` records how it was planned, so a schedule can re-plan it on measured times.
    ``layer_split``: blocks per stage when the planner chose the cut (``layers=`` profile).
    ``placement_kind``: ``"linear"``, ``"v"`` or ``None`` (another layout), as the plan says.
    """

    schedule: str
    actions: tuple[tuple[str, ...], ...]
    stage_ranks: tuple[int, ...]
    num_microbatches: int
    makespan: float | None = None
    bubble_rate: float | None = None
    peak_memory: tuple[float, ...] | None = None
    lower_bound: float | None = None
    csv: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    layer_split: tuple[int, ...] | None = None
    placement_kind: str | None = None

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    def stages_of(self, rank: int) -> list[int]:
        """The stage indices that ``rank`` runs, in increasing order."""
        return [s for s, r in enumerate(self.stage_ranks) if r == rank]

    def rank_of(self, stage: int) -> int:
        return self.stage_ranks[stage]

    def to_csv(self) -> str:
        """PyTorch's compute-only schedule CSV (row r = rank r)."""
        return "".join(",".join(row) + "\n" for row in self.actions)

    def digest(self) -> str:
        """A short hash of the action lists: equal on every rank iff the plans agree."""
        return _digest(self.actions)

    @classmethod
    def of(cls, plan: Any, inputs: Mapping[str, Any] | None = None) -> PlanSnapshot:
        """Copies what nobubble.torch needs out of a ``nobubble.plan`` result."""
        if isinstance(plan, PlanSnapshot):
            return plan
        _check_plan_like(plan)
        actions = tuple(tuple(str(a) for a in row) for row in plan.actions)
        stage_ranks = tuple(int(plan.rank_of(s)) for s in range(int(plan.num_stages)))
        peak = getattr(plan, "peak_memory", None)
        split = getattr(plan, "layer_split", None)
        snapshot = cls(
            schedule=str(plan.schedule),
            actions=actions,
            stage_ranks=stage_ranks,
            num_microbatches=int(plan.num_microbatches),
            makespan=_float_or_none(getattr(plan, "makespan", None)),
            bubble_rate=_float_or_none(getattr(plan, "bubble_rate", None)),
            peak_memory=None if peak is None else tuple(float(x) for x in peak),
            lower_bound=_float_or_none(getattr(plan, "lower_bound", None)),
            inputs=dict(inputs or {}),
            layer_split=None if split is None else tuple(int(b) for b in split),
            placement_kind=getattr(plan, "placement_kind", None),
        )
        snapshot.validate()
        return snapshot

    def validate(self) -> None:
        """Checks that the actions parse and agree with the stage→rank map (ValueError)."""
        if len(self.actions) != (max(self.stage_ranks) + 1 if self.stage_ranks else 0):
            raise ValueError(
                f"the plan has {len(self.actions)} action rows but its stages are placed on "
                f"{max(self.stage_ranks, default=-1) + 1} ranks; every rank needs a row"
            )
        for rank, row in enumerate(self.actions):
            for text in row:
                action = parse_action(text)
                stage = action.stage_index
                if stage >= self.num_stages:
                    raise ValueError(
                        f"plan action {text!r} names stage {stage}, but the plan has "
                        f"{self.num_stages} stages"
                    )
                if self.stage_ranks[stage] != rank:
                    raise ValueError(
                        f"plan action {text!r} is in rank {rank}'s row, but stage {stage} is "
                        f"placed on rank {self.stage_ranks[stage]}"
                    )
                if action.microbatch_index >= self.num_microbatches:
                    raise ValueError(
                        f"plan action {text!r} names microbatch {action.microbatch_index}, "
                        f"but the plan has {self.num_microbatches} microbatches"
                    )


def plan_from_csv(text: str, schedule: str = "csv") -> PlanSnapshot:
    """Reads PyTorch's compute-only schedule CSV (e.g. ``nobubble plan -f csv``) as a plan.

    Row r is rank r; a stage belongs to the row that holds it; the microbatch count is the
    largest microbatch number plus one. Empty cells (idle slots) are dropped: the runtime
    orders by dependencies, not by columns.
    """
    if not isinstance(text, str):
        raise TypeError(
            f"plan_from_csv takes the CSV's text, got {type(text).__name__}; read a file with "
            "Path(...).read_text()" + (", or decode bytes first" if isinstance(text, bytes) else "")
        )
    rows: list[tuple[str, ...]] = []
    for line in text.lstrip("\ufeff").splitlines():
        rows.append(tuple(c.strip().strip('"') for c in line.split(",") if c.strip()))
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise ValueError("the schedule CSV has no actions; expected rows like 0F0,0F1,0I0,0W0")
    placement: dict[int, int] = {}
    microbatches = 0
    for rank, row in enumerate(rows):
        if not row:
            raise ValueError(f"row {rank + 1} (rank {rank}) of the schedule CSV has no actions")
        for cell in row:
            action = parse_action(cell)
            owner = placement.setdefault(action.stage_index, rank)
            if owner != rank:
                raise ValueError(
                    f"stage {action.stage_index} appears in rows {owner} and {rank}; "
                    "a stage runs on one rank"
                )
            microbatches = max(microbatches, action.microbatch_index + 1)
    num_stages = max(placement) + 1
    missing = [s for s in range(num_stages) if s not in placement]
    if missing:
        raise ValueError(f"the schedule CSV never runs stages {missing}")
    snapshot = PlanSnapshot(
        schedule=schedule,
        actions=tuple(rows),
        stage_ranks=tuple(placement[s] for s in range(num_stages)),
        num_microbatches=microbatches,
        csv=text,
    )
    snapshot.validate()
    _check_runs(snapshot)
    return snapshot


def _in_bytes(limit: Any) -> bool:
    """Whether ``limit`` is an amount of memory (a size with a unit, or one per rank) rather
    than a multiple of M_B."""
    if isinstance(limit, (list, tuple)):
        return True
    if not isinstance(limit, str):
        return False
    try:
        float(limit)
    except ValueError:
        return limit.strip().lower() != "none"
    return False


def _check_runs(snapshot: PlanSnapshot) -> None:
    """Runs nobubble's validator on a plan read from elsewhere: a schedule that deadlocks or
    misses a pass fails here, naming the ranks and actions, instead of inside PyTorch's
    runtime (skipped when the Rust extension is not built)."""
    try:
        from nobubble import simulate
    except ImportError:
        return
    simulate([list(row) for row in snapshot.actions], name=snapshot.schedule)


def make_plan(
    schedule: str,
    *,
    num_ranks: int,
    num_microbatches: int,
    costs: Profile | None = None,
    mem_limit: MemLimit = None,
    comm: float | None = None,
    placement: str = "auto",
    chunks: int | None = None,
    objective: str | None = None,
    layers: Profile | None = None,
    **plan_kwargs: Any,
) -> PlanSnapshot:
    """Calls ``nobubble.plan`` in this process (no communication) and snapshots the result.

    ``layers`` (instead of ``costs``): a profile of ``[embedding, *blocks, head]``; the planner
    then also chooses the blocks per stage (``layer_split``), see
    :meth:`Profile.layer_costs_json`.

    ``objective`` defaults to ``"makespan"``: a PyTorch training step usually ends in a wait
    for every rank; pass ``"span"`` when iterations overlap (no cross-rank wait between
    steps).

    With ``costs`` (a :class:`Profile`) the plan's times are in ms and memory in bytes. A
    profile whose chunk count is not the plan's stage count is regrouped when the counts
    divide (see :meth:`Profile.regroup`). With ``placement="auto"`` and a profile of 2p
    chunks, the planner prices both layouts from the measured chunks (linear: neighbouring
    pairs summed; V: one chunk per stage) and zb-auto keeps the better under the objective;
    build the stages with :func:`~nobubble.torch.build_stages` from the same 2p chunks.
    """
    import nobubble

    planner = getattr(nobubble, "plan", None)
    if planner is None:
        raise ImportError(
            "nobubble.plan is not available: the Rust extension of the nobubble package is "
            "not built or not installed (build it with `maturin develop` in the repository)"
        )
    kwargs: dict[str, Any] = dict(plan_kwargs)
    kwargs.update(stages=num_ranks, microbatches=num_microbatches, placement=placement)
    if chunks is not None:
        kwargs["chunks"] = chunks
    # A PyTorch training step usually ends in a wait for every rank (a loss all-reduce,
    # global-norm clipping, the next step's barrier), so plan for the makespan unless told.
    kwargs["objective"] = objective or "makespan"
    if comm is not None:
        kwargs["comm"] = comm
    free: FreeMemory | None = None
    readings: list[MemoryReading] | None = None
    if isinstance(mem_limit, FreeMemory):
        if num_ranks != 1:
            raise ValueError(
                "mem_limit=FreeMemory() reads every rank's device: plan with agreed_plan on "
                "every rank of the process group, or give the limit in bytes (e.g. '20GiB')"
            )
        readings = [mem_limit.read()]
        free, mem_limit = mem_limit, mem_limit.budgets(readings)
    if mem_limit is not None:
        kwargs["mem_limit"] = mem_limit
    measured = costs is not None or layers is not None or "mem" in plan_kwargs
    if (free is not None or _in_bytes(mem_limit)) and not measured:
        given = "mem_limit=FreeMemory()" if free is not None else f"mem_limit={mem_limit!r}"
        raise ValueError(
            f"{given} is a budget in bytes and needs each stage's activation bytes: pass "
            "costs=nobubble.torch.profile(...) (or layers=), or give a multiple of M_B such "
            "as mem_limit=4"
        )
    if layers is not None and costs is not None:
        raise ValueError("pass costs= (per stage) or layers= (per layer), not both")
    try:
        if layers is not None:
            return _plan_layers(planner, schedule, kwargs, layers)
        if costs is not None:
            return _plan_with(planner, schedule, kwargs, costs, placement, num_ranks, chunks)
        plan = planner(schedule, **kwargs)
    except ValueError as exc:
        if free is None or readings is None:
            raise
        raise _with_readings(exc, free, readings) from None
    return PlanSnapshot.of(plan, inputs=dict(kwargs, schedule=schedule))


def _plan_layers(
    planner: Any, schedule: str, kwargs: dict[str, Any], layers: Profile
) -> PlanSnapshot:
    """Plans the cut and the order from per-layer costs.

    The recorded inputs are per *stage* (the plan's stage costs, the layers' memory summed
    per stage) with the placement fixed, so a re-plan changes the order, not the cut.
    """
    request = dict(kwargs, layer_costs=layers.layer_costs_json(float(kwargs.get("comm", 0.0))))
    plan = planner(schedule, **request)
    split = getattr(plan, "layer_split", None)
    stage_costs = getattr(plan, "stage_costs", None)
    inputs = {k: v for k, v in kwargs.items() if k != "layer_costs"}
    if split is not None and stage_costs is not None:
        mem = []
        start = 1
        for s, blocks in enumerate(split):
            group = list(layers.stages[start : start + blocks])
            start += blocks
            if s == 0:
                group.insert(0, layers.stages[0])
            if s == len(split) - 1:
                group.append(layers.stages[-1])
            mem.append((float(sum(g.mem_b for g in group)), float(sum(g.mem_w for g in group))))
        inputs.update(
            cost=[tuple(float(x) for x in c) for c in stage_costs],
            mem=mem,
            placement="v" if len(split) == 2 * int(plan.num_ranks) else "linear",
            time_unit="ms",
        )
    return PlanSnapshot.of(plan, inputs=dict(inputs, schedule=schedule))


def _plan_with(
    planner: Any,
    schedule: str,
    kwargs: dict[str, Any],
    costs: Profile,
    placement: str,
    num_ranks: int,
    chunks: int | None,
) -> PlanSnapshot:
    """Plans with ``costs``: the planner prices each layout from the chunks itself (one entry
    per rank is split over its chunks; a multiple of the stage count is summed into stages,
    so 2p chunks price both the linear and the V layout and zb-auto chooses between them).
    Other chunk counts are regrouped here when they divide the stage count."""
    request = dict(kwargs, placement=placement)
    stages = _stage_count(placement, num_ranks, chunks)
    n = costs.num_chunks
    if stages is None or n == num_ranks or n % stages == 0:
        fitted = costs
    else:
        fitted = costs.regroup(stages)
    request["cost"] = fitted.cost
    request["mem"] = fitted.mem
    plan = planner(schedule, **request)
    return PlanSnapshot.of(plan, inputs=dict(request, schedule=schedule, time_unit="ms"))


def agreed_plan(
    schedule: str,
    *,
    microbatches: int,
    costs: Profile | None = None,
    group: dist.ProcessGroup | None = None,
    layers: Profile | None = None,
    **plan_kwargs: Any,
) -> PlanSnapshot:
    """One plan for every rank of ``group``; call it on every rank (it is a collective).

    Every rank's ``costs`` (or ``layers``, a per-layer profile that lets the planner choose
    the cut too) are all-gathered and averaged per chunk (each rank measured on its own
    device; averaging also damps timing noise), rank 0 plans with :func:`make_plan`, and
    broadcasts the snapshot. The pipeline has as many ranks as ``group`` (default: the world).
    Without an initialised process group it plans locally, for ``num_ranks=`` ranks (a
    keyword of ``plan_kwargs``, default 1).

    ``mem_limit=FreeMemory()`` plans within what each rank's device has free: every rank
    reads its own (gathered with the profiles) and rank 0 plans within one budget per rank.
    """
    if not dist.is_available() or not dist.is_initialized():
        num_ranks = whole_number("num_ranks", plan_kwargs.pop("num_ranks", 1))
        return make_plan(
            schedule,
            num_ranks=num_ranks,
            num_microbatches=microbatches,
            costs=costs,
            layers=layers,
            **plan_kwargs,
        )
    num_ranks = whole_number("num_ranks", plan_kwargs.pop("num_ranks", dist.get_world_size(group)))
    if num_ranks != dist.get_world_size(group):
        raise ValueError(
            f"num_ranks={num_ranks} but the process group has {dist.get_world_size(group)} "
            "ranks; a pipeline plan has one row per rank of its group"
        )
    limit = plan_kwargs.get("mem_limit")
    reading: MemoryReading | str | None = None
    if isinstance(limit, FreeMemory):
        try:
            reading = limit.read()
        except Exception as exc:  # reported by rank 0: the others must not wait for this one
            reading = f"{type(exc).__name__}: {exc}"
    gathered: list[Any] = [None] * num_ranks
    key = _request_key(schedule, microbatches, plan_kwargs)
    dist.all_gather_object(gathered, (costs, layers, reading, key), group=group)
    merged = _average([g[0] for g in gathered])
    merged_layers = _average([g[1] for g in gathered])
    payload: list[Any] = [None]
    if dist.get_rank(group) == 0:
        readings: list[MemoryReading] | None = None
        try:
            readings = _readings([g[2] for g in gathered], limit)
            _check_same_request([g[3] for g in gathered])
            if isinstance(limit, FreeMemory) and readings is not None:
                plan_kwargs = dict(plan_kwargs, mem_limit=limit.budgets(readings))
            payload[0] = make_plan(
                schedule,
                num_ranks=num_ranks,
                num_microbatches=microbatches,
                costs=merged,
                layers=merged_layers,
                **plan_kwargs,
            )
        except Exception as exc:  # every rank must leave the broadcast with the error
            if isinstance(limit, FreeMemory) and isinstance(exc, ValueError) and readings:
                exc = _with_readings(exc, limit, readings)
            payload[0] = exc
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(payload, src=src, group=group)
    if isinstance(payload[0], Exception):
        raise payload[0]
    return payload[0]


def _request_key(schedule: str, microbatches: int, kwargs: Mapping[str, Any]) -> str:
    """What every rank must ask for alike: not each rank's own device or reserve, nor the
    layout a PlannedSchedule reads off each rank's stages (a rank whose stages fit another
    layout is caught once the plan is made)."""
    own = ("placement", "chunks")
    shown = {
        k: ("FreeMemory" if isinstance(v, FreeMemory) else v)
        for k, v in kwargs.items()
        if k not in own
    }
    return repr((schedule, microbatches, sorted(shown.items(), key=lambda kv: kv[0])))


def _check_same_request(keys: list[str]) -> None:
    """A ``ValueError`` naming the ranks whose planning arguments differ from rank 0's:
    rank 0 plans for all, so another rank's arguments would be silently ignored."""
    differ = [r for r, k in enumerate(keys) if k != keys[0]]
    if differ:
        raise ValueError(
            f"rank(s) {differ} asked for a different plan than rank 0 (schedule, microbatches "
            f"or planning arguments): rank 0 {keys[0]}, rank {differ[0]} {keys[differ[0]]}; "
            "pass the same arguments on every rank"
        )


def _readings(gathered: list[Any], limit: Any) -> list[MemoryReading] | None:
    """Every rank's :class:`MemoryReading` when rank 0's ``limit`` is a :class:`FreeMemory`
    (``None`` otherwise); a ``ValueError`` naming the ranks that could not read theirs or did
    not ask for it."""
    if not isinstance(limit, FreeMemory):
        others = [r for r, g in enumerate(gathered) if g is not None]
        if others:
            raise ValueError(
                f"rank(s) {others} gave mem_limit=FreeMemory() and rank 0 did not: pass the "
                "same mem_limit on every rank"
            )
        return None
    for r, g in enumerate(gathered):
        if g is None:
            raise ValueError(
                f"rank {r} gave no mem_limit=FreeMemory() while rank 0 did: pass the same "
                "mem_limit on every rank"
            )
        if isinstance(g, str):
            raise ValueError(f"rank {r} could not read its free memory: {g}")
    return list(gathered)


def _with_readings(exc: ValueError, limit: FreeMemory, readings: list[MemoryReading]) -> ValueError:
    """``exc`` about budgets ``limit`` made, with what each rank read (same type)."""
    if not str(exc).startswith("mem_limit"):
        return exc
    return type(exc)(f"{exc} ({limit.explain(readings)})")


def _average(profiles: Sequence[Profile | None]) -> Profile | None:
    present = [p for p in profiles if p is not None]
    return Profile.average(present) if present else None


def check_same_plan(plan: PlanSnapshot, group: dist.ProcessGroup | None = None) -> None:
    """Raises ValueError on every rank unless all ranks of ``group`` hold the same plan."""
    if not dist.is_available() or not dist.is_initialized():
        return
    size = dist.get_world_size(group)
    if size == 1:
        return
    digests: list[str | None] = [None] * size
    dist.all_gather_object(digests, plan.digest(), group=group)
    if len(set(digests)) != 1:
        groups: dict[str | None, list[int]] = {}
        for rank, d in enumerate(digests):
            groups.setdefault(d, []).append(rank)
        raise ValueError(
            "the ranks hold different plans (ranks grouped by plan: "
            f"{sorted(groups.values())}); PyTorch runs one plan SPMD. Plan from identical "
            "inputs on every rank, or use nobubble.torch.agreed_plan(...) / "
            "PlannedSchedule(schedule=..., costs=...) to plan on rank 0 and broadcast"
        )


def _digest(actions: Sequence[Sequence[str]]) -> str:
    text = "\n".join(",".join(row) for row in actions)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stage_count(placement: str, num_ranks: int, chunks: int | None) -> int | None:
    if placement == "linear":
        return num_ranks
    if placement == "v":
        return num_ranks * (chunks or 2)
    return None


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _check_plan_like(plan: Any) -> None:
    missing = [
        name
        for name in ("schedule", "num_stages", "num_microbatches", "actions", "rank_of")
        if not hasattr(plan, name)
    ]
    if missing:
        raise TypeError(
            f"plan must be a nobubble plan (from nobubble.plan(...)) or a PlanSnapshot; "
            f"{type(plan).__name__} has no {', '.join(missing)}"
        )


def check_ms(name: str, value: Any) -> None:
    """A time in ms given by the caller: a finite number, zero or more."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a time in ms, a finite number ≥ 0; got {value!r}")


def replan(
    plan: PlanSnapshot,
    cost: Sequence[tuple[float, ...]],
    comm: float | None = None,
    overhead: float = 0.0,
) -> PlanSnapshot:
    """The same planning request as ``plan``'s, with ``cost`` (per stage F, I, W[, B], ms)
    instead, ``overhead`` (the runtime's time between passes, ms) added to every pass, and
    ``comm`` (the link latency, ms) when given.

    Only for plans that record their inputs (made by :func:`make_plan`/:func:`agreed_plan`).
    Without ``comm`` the first request's stays, unless that request was not in ms: a latency
    in another unit beside costs in ms would be wrong, so it is dropped (none is assumed).
    The new plan's inputs record ``overhead``, so its costs can be read back as pass times.
    """
    check_ms("overhead", overhead)
    if comm is not None:
        check_ms("comm", comm)
    if not plan.inputs:
        raise ValueError(
            "this plan does not record how it was planned (it was given, not made here); "
            "plan with nobubble.torch.agreed_plan(...) to be able to re-plan"
        )
    import nobubble

    kwargs = dict(plan.inputs)
    schedule = kwargs.pop("schedule")
    unit = kwargs.pop("time_unit", None)  # notes of ours, not planner arguments
    kwargs.pop("overhead", None)
    kwargs["cost"] = [tuple(float(x) + overhead for x in c) for c in cost]
    if comm is not None:
        kwargs["comm"] = float(comm)
    elif unit != "ms":
        kwargs.pop("comm", None)
    # The planner took one entry per model chunk, which may be finer than the stages (2p
    # chunks for a linear pipeline) or coarser (one per rank of a V): sum the memory of
    # consecutive chunks into each stage, or share a chunk's out over its stages, as the
    # planner did, to go with the measured per-stage times.
    mem = kwargs.get("mem")
    per_chunk = isinstance(mem, (list, tuple)) and all(isinstance(m, (list, tuple)) for m in mem)
    if per_chunk and len(mem) > len(cost) and len(mem) % len(cost) == 0:
        k = len(mem) // len(cost)
        kwargs["mem"] = [
            tuple(float(sum(m[j] for m in mem[s * k : (s + 1) * k])) for j in range(2))
            for s in range(len(cost))
        ]
    elif per_chunk and len(mem) > 1 and len(mem) < len(cost) and len(cost) % len(mem) == 0:
        k = len(cost) // len(mem)
        kwargs["mem"] = [tuple(float(x) / k for x in mem[s // k]) for s in range(len(cost))]
    # The stages are built: keep their placement (and, with a layer split, their cut).
    if plan.placement_kind is None:
        kwargs.pop("placement", None)
    else:
        kwargs["placement"] = plan.placement_kind
    kwargs.pop("layer_costs", None)
    new = nobubble.plan(schedule, **kwargs)
    # Re-planned on measured pass times: ms, whatever the first plan's unit was.
    notes = {"time_unit": "ms", "overhead": float(overhead)}
    return PlanSnapshot.of(new, inputs=dict(kwargs, schedule=schedule, **notes))
