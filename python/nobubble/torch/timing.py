"""Measured against planned: timing every action of real steps on every rank.

A plan is a prediction from profiled costs; a real step adds communication, Python
overhead and interference between ranks. Recording each F/I/W/B action's start and end on
every rank lets us report the step's measured bubble next to the planner's, write a
Chrome/Perfetto trace of what happened, and re-plan on the times actually seen.

Clocks: each rank times with ``time.perf_counter`` from a barrier at the start of the step,
so ranks on different machines share a zero to within the barrier's latency.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
        return (
            f"step {self.step_ms:.2f} ms (passes end at {self.makespan_ms:.2f} ms; planned "
            f"{predicted}), bubble rate {100 * self.bubble_rate:.1f}% (planned {planned_bubble}), "
            f"idle share {100 * self.bubble_fraction:.1f}%"
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
        self.t0 = self.now()
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
