"""Measured against planned: timing every action of real steps on every rank.

A plan is a prediction from profiled costs; a real step adds communication, Python
overhead and interference between ranks. Recording each F/I/W/B action's start and end on
every rank lets us report the step's measured bubble next to the planner's, write a
Chrome/Perfetto trace of what happened, and re-plan on the times actually seen.

Clocks: each rank times with ``time.perf_counter`` from a barrier at the start of the step.
Ranks on one host read one monotonic clock, so there their timings are put on one axis
exactly; ranks on different machines share a zero to within the barrier's latency.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

KINDS = ("F", "I", "W", "B")


@dataclass(frozen=True)
class ActionTiming:
    """One executed action: times in ms from the step's start on its rank."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class StepMeasurement:
    """One measured step of all ranks, beside what the plan predicted.

    ``bubble_rate`` is ``1 − max(busy)/max(span)`` (the paper's measure, the planner's
    ``bubble_rate``); ``bubble_fraction`` is ``1 − Σ busy/(ranks · makespan)``, the share of all
    device time left idle, start-up stagger included. ``step_ms`` is the slowest rank's wall
    time of ``step()`` (from the barrier before it), communication and Python included.
    """

    step_ms: float
    makespan_ms: float
    busy_ms: tuple[float, ...]
    span_ms: tuple[float, ...]
    bubble_rate: float
    bubble_fraction: float
    predicted_ms: float | None
    predicted_bubble_rate: float | None
    actions: tuple[ActionTiming, ...] = field(repr=False)

    def pass_times(self) -> dict[int, tuple[float, float, float]]:
        """Per stage, the median measured (F, I, W) in ms (a B counts as I; W then 0)."""
        return pass_times([self])

    def message_latency(self) -> float | None:
        """The message latency this step shows, ms (see :func:`message_latency`)."""
        return message_latency([self])

    def action_overhead(self) -> float | None:
        """The runtime's time between passes in this step, ms (see :func:`action_overhead`)."""
        return action_overhead([self])

    def trace(self) -> dict[str, Any]:
        """The step as a Chrome/Perfetto trace: pid = rank, tid = stage, times in µs."""
        return chrome_trace([self])

    def summary(self) -> str:
        predicted = "n/a" if self.predicted_ms is None else f"{self.predicted_ms:.2f} ms"
        planned_bubble = (
            "n/a"
            if self.predicted_bubble_rate is None
            else f"{100 * self.predicted_bubble_rate:.1f}%"
        )
        latency, overhead = self.message_latency(), self.action_overhead()
        messages = "" if latency is None else f", message latency {latency:.3f} ms"
        if overhead is not None:
            messages += f", {overhead:.3f} ms between passes"
        return (
            f"step {self.step_ms:.2f} ms (passes end at {self.makespan_ms:.2f} ms; planned "
            f"{predicted}), bubble rate {100 * self.bubble_rate:.1f}% (planned {planned_bubble}), "
            f"idle share {100 * self.bubble_fraction:.1f}%{messages}"
        )


def pass_times(steps: Sequence[StepMeasurement]) -> dict[int, tuple[float, float, float]]:
    """Per stage, median (F, I, W) ms over all microbatches of ``steps``."""
    samples: dict[int, dict[str, list[float]]] = {}
    for step in steps:
        for a in step.actions:
            kinds = samples.setdefault(a.stage, {k: [] for k in KINDS})
            kinds[a.kind].append(a.duration_ms)
    out: dict[int, tuple[float, float, float]] = {}
    for stage, kinds in sorted(samples.items()):
        f = statistics.median(kinds["F"]) if kinds["F"] else 0.0
        if kinds["I"]:
            i = statistics.median(kinds["I"])
            w = statistics.median(kinds["W"]) if kinds["W"] else 0.0
        else:
            i = statistics.median(kinds["B"]) if kinds["B"] else 0.0
            w = 0.0
        out[stage] = (f, i, w)
    return out


def message_latency(steps: Sequence[StepMeasurement]) -> float | None:
    """The message latency the steps show (ms): the planner's ``comm``, measured.

    A pass that hands its result to another rank (F to the next stage's F, a backward to the
    previous stage's backward) and the pass that takes it are timed on their two ranks; when
    the receiving rank had finished everything before it by the time the sender finished, the
    gap between them is the message's latency as the plan sees it: the send, the transfer,
    the receive and the runtime's time around them (see :func:`action_overhead`).

    Ranks on one host are timed on one clock (:func:`on_one_clock`); on different hosts each
    rank's zero is its exit from the step's barrier, and two zeros can differ enough to make
    gaps negative one way. Messages go both ways between neighbours (forwards one way,
    backwards the other), and an offset adds to one direction what it takes from the other:
    so for each pair of ranks the figure is the mean of the two directions' median gaps, and
    the result the median over pairs. That cancels offsets small against the gaps; a larger
    one also changes which receivers look idle, and where only one direction was seen
    nothing cancels, so across hosts the figure is rough. ``None`` when no message was seen
    (one rank).
    """
    gaps: dict[tuple[int, int], list[float]] = {}
    for step in steps:
        for sender, receiver in _waited_messages(step.actions):
            gap = receiver.start_ms - sender.end_ms
            gaps.setdefault((sender.rank, receiver.rank), []).append(gap)
    estimates = []
    for a, b in sorted({(min(pair), max(pair)) for pair in gaps}):
        ways = [statistics.median(gaps[d]) for d in ((a, b), (b, a)) if d in gaps]
        estimates.append(sum(ways) / len(ways))
    return max(0.0, statistics.median(estimates)) if estimates else None


def action_overhead(steps: Sequence[StepMeasurement]) -> float | None:
    """The runtime's time between passes (ms): what each action costs beyond its pass.

    PyTorch's runtime does bookkeeping between two compute actions (posting sends and
    receives, waiting on finished sends, Python); the timed passes leave it out. It shows
    as the gap before a pass whose input is already on its rank (a W, the first stage's F,
    the last stage's backward, a V's turn on one rank): the median of those gaps, ``None``
    when there are none. A re-plan adds it to every pass.
    """
    gaps: list[float] = []
    for step in steps:
        rank_of = {a.stage: a.rank for a in step.actions}
        for rank_actions in _per_rank(step.actions).values():
            for prev, a in zip(rank_actions, rank_actions[1:]):
                if _input_is_local(a, rank_of):
                    gaps.append(a.start_ms - prev.end_ms)
    return max(0.0, statistics.median(gaps)) if gaps else None


def _input_is_local(a: ActionTiming, rank_of: dict[int, int]) -> bool:
    """Whether what ``a`` needs was made on its own rank (or is the step's input)."""
    if a.kind == "W":
        return True
    source = a.stage - 1 if a.kind == "F" else a.stage + 1
    if source in (-1, max(rank_of) + 1):
        return True  # the step's input (first stage), the loss (last stage)
    return rank_of.get(source) == a.rank


def _waited_messages(
    actions: Sequence[ActionTiming],
) -> Iterator[tuple[ActionTiming, ActionTiming]]:
    """The (sender, receiver) pass pairs across ranks where the receiving rank had nothing
    left to do when the sender finished: their gap is the message's."""
    by_key = {(a.stage, a.kind, a.microbatch): a for a in actions}
    idle_from: dict[int, float] = {}  # per action: when its rank's previous action ended
    for rank_actions in _per_rank(actions).values():
        for prev, a in zip(rank_actions, rank_actions[1:]):
            idle_from[id(a)] = prev.end_ms
    for a in actions:
        for kind in _RECEIVER_KINDS[a.kind]:
            target = by_key.get((_receiver_stage(a), kind, a.microbatch))
            if target is None or target.rank == a.rank:
                continue
            if idle_from.get(id(target), float("-inf")) <= a.end_ms:
                yield a, target


#: Which passes of the neighbouring stage take a pass's result (a backward's input gradient
#: goes to the previous stage's I, or its B when that stage's backward is fused).
_RECEIVER_KINDS: dict[str, tuple[str, ...]] = {
    "F": ("F",),
    "I": ("I", "B"),
    "B": ("I", "B"),
    "W": (),
}


def _receiver_stage(a: ActionTiming) -> int:
    return a.stage + 1 if a.kind == "F" else a.stage - 1


def _per_rank(actions: Sequence[ActionTiming]) -> dict[int, list[ActionTiming]]:
    out: dict[int, list[ActionTiming]] = {}
    for a in sorted(actions, key=lambda a: (a.rank, a.start_ms)):
        out.setdefault(a.rank, []).append(a)
    return out


def fused_times(steps: Sequence[StepMeasurement]) -> dict[int, float]:
    """Per stage that ran fused backward passes, their median B time in ms."""
    samples: dict[int, list[float]] = {}
    for step in steps:
        for a in step.actions:
            if a.kind == "B":
                samples.setdefault(a.stage, []).append(a.duration_ms)
    return {stage: statistics.median(v) for stage, v in sorted(samples.items())}


def chrome_trace(steps: Sequence[StepMeasurement]) -> dict[str, Any]:
    """Several steps, one after another, as one Chrome/Perfetto trace."""
    events: list[dict[str, Any]] = []
    offset = 0.0
    for n, step in enumerate(steps):
        for a in step.actions:
            events.append(
                {
                    "name": f"{a.kind}{a.microbatch}",
                    "cat": a.kind,
                    "ph": "X",
                    "pid": a.rank,
                    "tid": a.stage,
                    "ts": round((offset + a.start_ms) * 1e3, 3),
                    "dur": round(a.duration_ms * 1e3, 3),
                    "args": {"stage": a.stage, "microbatch": a.microbatch, "step": n},
                }
            )
        offset += step.step_ms
    ranks = sorted({a.rank for s in steps for a in s.actions})
    for rank in ranks:
        events.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, steps: Sequence[StepMeasurement]) -> None:
    """Writes :func:`chrome_trace` as JSON (open it in ui.perfetto.dev)."""
    Path(path).write_text(json.dumps(chrome_trace(steps)))


class ActionRecorder:
    """Collects one rank's action timings during a step (installed on its stages)."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank = rank
        self.cuda = torch.device(device).type == "cuda"
        self.device = torch.device(device)
        self.t0 = 0.0
        self.actions: list[ActionTiming] = []
        self.active = False

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def begin(self) -> None:
        self.actions = []
        self.t0 = self.now()  # the step's origin on this rank (see on_one_clock)
        self.active = True

    def end(self) -> float:
        """Stops recording; returns this rank's wall time since :meth:`begin` (ms)."""
        self.active = False
        return (self.now() - self.t0) * 1e3

    def record(self, stage: int, kind: str, microbatch: int, start: float, end: float) -> None:
        if self.active:
            self.actions.append(
                ActionTiming(
                    rank=self.rank,
                    stage=stage,
                    kind=kind,
                    microbatch=microbatch,
                    start_ms=(start - self.t0) * 1e3,
                    end_ms=(end - self.t0) * 1e3,
                )
            )

    def extend_last(self, stage: int, microbatch: int, end: float) -> None:
        """Adds the loss computation (run after a last stage's forward) to that F."""
        if not self.active:
            return
        for k in range(len(self.actions) - 1, -1, -1):
            a = self.actions[k]
            if a.stage == stage and a.microbatch == microbatch and a.kind == "F":
                self.actions[k] = ActionTiming(
                    a.rank, a.stage, a.kind, a.microbatch, a.start_ms, (end - self.t0) * 1e3
                )
                return

    def wrap(self, stage: Any, method: str, kind_of: Callable[..., str]) -> None:
        """Replaces ``stage.<method>`` (on the instance) by a timed call of the original."""
        original = getattr(stage, method)
        recorder = self

        def timed(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            if not recorder.active:
                return original(chunk_id, *args, **kwargs)
            start = recorder.now()
            result = original(chunk_id, *args, **kwargs)
            recorder.record(
                stage.stage_index, kind_of(*args, **kwargs), chunk_id, start, recorder.now()
            )
            return result

        timed.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(stage, method, timed)


def host_identity() -> str:
    """Which machine (and boot) this process runs on: ranks with the same identity read one
    monotonic clock. The host name alone can repeat across machines; Linux's boot id does
    not."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def on_one_clock(
    actions: Sequence[Sequence[ActionTiming]], origins: Sequence[float], hosts: Sequence[str]
) -> list[ActionTiming]:
    """Every rank's actions (``actions[r]``, in ms from rank r's ``origins[r]``, a
    ``perf_counter`` reading in seconds) on one time axis.

    Each rank times from its own exit from the step's barrier. Processes on one host read
    the same monotonic clock, so when every rank has one :func:`host_identity` the zeros
    are aligned exactly, the earliest exit becoming 0; otherwise (or if the origins lie
    further apart than a barrier's exits can, so the clocks are not one) the barrier's
    zeros stay.
    """
    shift = [0.0] * len(actions)
    if len(set(hosts)) == 1 and origins and max(origins) - min(origins) < 1.0:
        shift = [(o - min(origins)) * 1e3 for o in origins]
    return [
        replace(a, start_ms=a.start_ms + d, end_ms=a.end_ms + d) if d else a
        for row, d in zip(actions, shift)
        for a in row
    ]


def summarize(
    wall_ms: Sequence[float],
    actions: Sequence[ActionTiming],
    num_ranks: int,
    predicted_ms: float | None,
    predicted_bubble_rate: float | None,
) -> StepMeasurement:
    """Builds a :class:`StepMeasurement` from every rank's wall time and actions."""
    busy = [0.0] * num_ranks
    first = [float("inf")] * num_ranks
    last = [0.0] * num_ranks
    for a in actions:
        busy[a.rank] += a.duration_ms
        first[a.rank] = min(first[a.rank], a.start_ms)
        last[a.rank] = max(last[a.rank], a.end_ms)
    span = [max(0.0, e - s) if s != float("inf") else 0.0 for s, e in zip(first, last)]
    makespan = max(last) if last else 0.0
    max_span = max(span) if span else 0.0
    rate = 1.0 - max(busy) / max_span if max_span > 0 else 0.0
    fraction = 1.0 - sum(busy) / (num_ranks * makespan) if makespan > 0 else 0.0
    ordered = tuple(sorted(actions, key=lambda a: (a.rank, a.start_ms)))
    return StepMeasurement(
        step_ms=max(wall_ms),
        makespan_ms=makespan,
        busy_ms=tuple(busy),
        span_ms=tuple(span),
        bubble_rate=max(0.0, rate),
        bubble_fraction=max(0.0, fraction),
        predicted_ms=predicted_ms,
        predicted_bubble_rate=predicted_bubble_rate,
        actions=ordered,
    )
