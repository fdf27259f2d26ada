"""``PlannedSchedule``: a nobubble plan executed by PyTorch's own pipeline runtime.

PyTorch's zero-bubble schedules (``ScheduleZBVZeroBubble``, ``ScheduleInterleavedZeroBubble``)
are subclasses of ``_PipelineScheduleRuntime`` that compute a fixed per-rank action list
and hand it to the runtime, which adds the sends and receives and executes it. A nobubble
plan is such an action list, computed for the measured costs and the memory limit. So
``PlannedSchedule`` is the same kind of subclass: it sets ``pipeline_order`` from the plan
and lets the runtime lower and run it. Communication (gloo on CPU, NCCL on GPUs), the I/W
split, gradient scaling and FSDP/DDP handling are PyTorch's, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from nobubble import ScheduleError
from nobubble.torch._compat import (
    TESTED_TORCH,
    _PipelineScheduleRuntime,
    _PipelineStageBase,
    parse_action,
)
from nobubble.torch.plans import (
    MemLimit,
    PlanSnapshot,
    agreed_plan,
    check_ms,
    check_same_plan,
    make_plan,
    replan,
)
from nobubble.torch.profiling import MIN_MS, Profile, StageProfile
from nobubble.torch.timing import (
    ActionRecorder,
    StepMeasurement,
    action_overhead,
    fused_times,
    host_identity,
    message_latency,
    on_one_clock,
    pass_times,
    summarize,
)


class PlannedSchedule(_PipelineScheduleRuntime):
    """Runs a nobubble plan's per-rank F/I/W action lists with PyTorch's pipeline runtime.

    Built like ``ScheduleZBVZeroBubble(stages, n_microbatches, loss_fn)``, with ``stages``
    this rank's ``PipelineStage`` objects, plus either

    - ``plan=``: a ``nobubble.plan(...)`` result (or :class:`PlanSnapshot`); every rank must
      pass the same plan (checked: construction all-gathers a hash of it), or
    - ``schedule=`` (default ``"zb-auto"``), ``costs=`` (a :class:`Profile`), ``mem_limit=``,
      ``comm=``, ``objective=``: plan here. Construction is then a collective: the ranks'
      profiles are all-gathered and averaged, rank 0 plans, and the plan is broadcast. The
      placement follows the stages given: one per rank plans a linear pipeline, two per
      rank a V (rank r holds stages r and 2p−1−r), k per rank looped over the ranks (stage
      s on rank s mod p) an interleaved schedule.

    ``measure=True`` times every action on every rank (``step`` then ends with a small
    all-gather) and appends a :class:`StepMeasurement` to ``self.measurements``;
    ``replan_after=k`` re-plans once after k measured steps on the measured pass times, time
    between passes and message latency (for plans that record their inputs: made here, or by
    :func:`agreed_plan`); the schedule's first step is a warm-up and counts only when no
    other is measured (``k = 2`` plans on the second step). The new plan is ``self.plan``
    (and ``self.replanned``) from the next step on; :meth:`replan` does the same whenever
    called. Other keywords go to
    ``_PipelineScheduleRuntime`` (``defer_pp_recv``, ``max_active_stages``, ...).
    """

    def __init__(
        self,
        stages: Sequence[_PipelineStageBase],
        n_microbatches: int,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        args_chunk_spec: Any = None,
        kwargs_chunk_spec: Any = None,
        output_merge_spec: Any = None,
        scale_grads: bool = True,
        *,
        plan: Any = None,
        schedule: str | None = None,
        costs: Profile | None = None,
        mem_limit: MemLimit = None,
        comm: float | None = None,
        objective: str | None = None,
        plan_kwargs: dict[str, Any] | None = None,
        measure: bool = False,
        replan_after: int | None = None,
        **runtime_kwargs: Any,
    ) -> None:
        stage_list = _check_stages(stages)
        _check_microbatches(n_microbatches)
        first = stage_list[0]
        group = first.group
        rank, size = first.group_rank, first.group_size
        collective = _is_collective(group, size)

        if plan is not None and (schedule is not None or costs is not None):
            raise ValueError(
                "pass either plan= (a ready plan) or schedule=/costs= (plan here), not both"
            )
        if plan is not None:
            snapshot = PlanSnapshot.of(plan)
            _agree(
                collective,
                group,
                size,
                _plan_error(snapshot, stage_list, rank, size, n_microbatches),
            )
            if collective:
                check_same_plan(snapshot, group)
        else:
            placement, chunks = _placement_of(stage_list, size)
            if schedule is None and placement == "auto":
                # Looped stages (rank r holds r, r + p, …): zb-auto plans linear or V only.
                schedule = "interleaved-zb"
            kwargs = dict(plan_kwargs or {})
            if chunks is not None:
                kwargs["chunks"] = chunks
            request: dict[str, Any] = dict(
                kwargs,
                mem_limit=mem_limit,
                comm=comm,
                objective=objective,
                placement=placement,
                num_ranks=size,
            )
            try:
                if collective:
                    snapshot = agreed_plan(
                        schedule or "zb-auto",
                        microbatches=n_microbatches,
                        costs=costs,
                        group=group,
                        **request,
                    )
                else:
                    size_ = request.pop("num_ranks")
                    snapshot = make_plan(
                        schedule or "zb-auto",
                        num_ranks=size_,
                        num_microbatches=n_microbatches,
                        costs=costs,
                        **request,
                    )
            except ScheduleError as exc:
                # The chunks were read off the stages, not given: say so, not "chunks=".
                if str(exc).startswith("chunks") and "chunks" not in (plan_kwargs or {}):
                    layout = "in a V" if placement == "v" else "looped over the ranks"
                    raise ScheduleError(
                        f"these stages are built {chunks} per rank, {layout}, which "
                        f"{schedule or 'zb-auto'} does not plan: pick a schedule for that "
                        f"layout (V: zb-auto, zb-v, v-half, v-min; looped: interleaved-zb, "
                        f"interleaved-1f1b) or build one stage per rank ({exc})"
                    ) from exc
                raise
            _agree(
                collective,
                group,
                size,
                _plan_error(snapshot, stage_list, rank, size, n_microbatches),
            )
        if replan_after is not None:
            if replan_after < 1:
                raise ValueError("replan_after must be a positive number of measured steps")
            if not snapshot.inputs:
                raise ValueError(
                    "replan_after needs a plan that records how it was planned: pass "
                    "schedule=/costs= instead of plan=, or a plan from "
                    "nobubble.torch.agreed_plan(...); a nobubble.plan(...) result or a CSV "
                    "plan does not record the costs and memory it was planned with"
                )
            measure = True

        super().__init__(
            stages=stage_list,
            n_microbatches=n_microbatches,
            loss_fn=loss_fn,
            args_chunk_spec=args_chunk_spec,
            kwargs_chunk_spec=kwargs_chunk_spec,
            output_merge_spec=output_merge_spec,
            scale_grads=scale_grads,
            **runtime_kwargs,
        )
        self._group = group
        self._collective = collective
        self.plan: PlanSnapshot = snapshot
        self.measurements: list[StepMeasurement] = []
        self._measured_under: list[PlanSnapshot] = []  # the plan each measured step ran
        self.replanned: PlanSnapshot | None = None
        self._replan_after = replan_after
        self._costs = costs
        self._recorder: ActionRecorder | None = None
        self._measuring = False
        self._stepped = False  # whether a training step has run (the first is a warm-up)
        self._warmup_measured = False  # whether measurements[0] is the schedule's first step
        self._in_eval = False
        self._host = host_identity()
        self._load_plan(snapshot)
        self.measure = measure

    @property
    def measure(self) -> bool:
        """Whether ``step`` times every action (switch it on for a few steps, e.g. to compare
        with the plan, and off again to train without the end-of-step all-gather)."""
        return self._measuring

    @measure.setter
    def measure(self, enabled: bool) -> None:
        if enabled and self._recorder is None:
            self._install_recorder(self._stages[0].device)
        self._measuring = bool(enabled)

    # -- plan ----------------------------------------------------------------------------

    def _load_plan(self, snapshot: PlanSnapshot) -> None:
        """Hands the plan's compute-only action lists to PyTorch's lowering (adds comms)."""
        order = {r: [parse_action(a) for a in row] for r, row in enumerate(snapshot.actions)}
        self.pipeline_order = order
        # The forward-only program `eval` runs, made on first use.
        self._forward_order = {r: [a for a in row if "F" in str(a)] for r, row in order.items()}
        self._forward_lowered: dict[int, list[Any]] | None = None
        try:
            self._prepare_schedule_with_comms(self.pipeline_order)
        except AssertionError as exc:
            raise ValueError(
                f"PyTorch {torch.__version__} refused the plan {snapshot.schedule!r}: {exc}"
            ) from exc

    # -- measuring -----------------------------------------------------------------------

    def _install_recorder(self, device: torch.device) -> None:
        recorder = ActionRecorder(self.rank, device)
        for stage in self._stages:
            recorder.wrap(stage, "forward_one_chunk", lambda *a, **k: "F")
            recorder.wrap(
                stage,
                "backward_one_chunk",
                lambda *a, full_backward=True, **k: "B" if full_backward else "I",
            )
            recorder.wrap(stage, "backward_weight_one_chunk", lambda *a, **k: "W")
        self._recorder = recorder

    def _maybe_compute_loss(
        self,
        stage: _PipelineStageBase,
        output: Any,
        target_mbs: list[Any] | None,
        mb_index: int,
        loss_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """PyTorch computes the loss right after the last stage's F; we count it in that F."""
        super()._maybe_compute_loss(stage, output, target_mbs, mb_index, loss_kwargs)
        if self._recorder is not None and self._recorder.active and stage.is_last:
            self._recorder.extend_last(stage.stage_index, mb_index, self._recorder.now())

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """One training iteration, like PyTorch's schedules' ``step``.

        ``step(x, target=y, losses=losses)`` splits the batch into ``n_microbatches``
        microbatches (or pass pre-split ``arg_mbs=``/``target_mbs=``). With ``measure=True``
        every rank must call it (it ends with an all-gather of the action timings).
        """
        _check_batch(args, kwargs.get("target"), self._n_microbatches)
        self._check_step_inputs(kwargs)
        if self._in_eval:  # PyTorch's eval runs through step: not a training step
            return super().step(*args, **kwargs)
        first, self._stepped = not self._stepped, True
        with _peer_failures_explained():
            if self._recorder is None or not self._measuring:
                return super().step(*args, **kwargs)
            if self._collective:
                dist.barrier(group=self._group)
            self._recorder.begin()
            try:
                result = super().step(*args, **kwargs)
            finally:
                wall = self._recorder.end()
            self._warmup_measured |= first
            self._finish_measurement(wall)
            return result

    def eval(self, *args: Any, **kwargs: Any) -> Any:
        """One forward-only iteration, like PyTorch's schedules' ``eval`` (same arguments and
        results; the losses of the last stage's microbatches go to ``losses=``).

        It runs the plan's forward passes alone, in the plan's order. PyTorch's own ``eval``
        runs the training lists without their backward, which fails where a rank holds two
        adjacent stages, as every V plan places them (``ScheduleZBVZeroBubble.eval`` fails
        the same way). Never measured.
        """
        _check_batch(args, kwargs.get("target"), self._n_microbatches)
        training = (self.pipeline_order, self.pipeline_order_with_comms, self._measuring)
        if self._forward_lowered is None:
            # PyTorch's lowering insists on backward passes: keep the forward part of the
            # training program instead (a subsequence, so as free of deadlock as the whole).
            self._forward_lowered = {
                rank: [a for a in row if a.computation_type.value in _FORWARD_PROGRAM]
                for rank, row in self.pipeline_order_with_comms.items()
            }
        self.pipeline_order = self._forward_order
        self.pipeline_order_with_comms = self._forward_lowered
        self._measuring, self._in_eval = False, True
        try:
            with _peer_failures_explained():
                return super().eval(*args, **kwargs)
        finally:
            self.pipeline_order, self.pipeline_order_with_comms, self._measuring = training
            self._in_eval = False

    def _check_step_inputs(self, kwargs: dict[str, Any]) -> None:
        """The rank with the last stage needs the targets when there is a loss: PyTorch's own
        error for a missing one does not say so."""
        has_last = any(s.is_last for s in self._stages)
        wants_target = has_last and self._loss_fn is not None
        if wants_target and kwargs.get("target") is None and kwargs.get("target_mbs") is None:
            raise ValueError(
                "this rank holds the last stage and the schedule has a loss: pass "
                "step(..., target=y)"
            )

    def _finish_measurement(self, wall_ms: float) -> None:
        recorder = self._recorder
        assert recorder is not None  # step() measures only with one installed
        local = (wall_ms, recorder.actions, recorder.t0, self._host)
        if self._collective:
            gathered: list[Any] = [None] * self.pp_group_size
            dist.all_gather_object(gathered, local, group=self._group)
        else:
            gathered = [local]
        walls = [g[0] for g in gathered]
        actions = on_one_clock(
            [g[1] for g in gathered], [g[2] for g in gathered], [g[3] for g in gathered]
        )
        # The plan's makespan is in ms only when it was planned on measured costs; on unit
        # costs (or a plan given, in unknown units) there is no time to compare with.
        in_ms = self.plan.inputs.get("time_unit") == "ms"
        measurement = summarize(
            walls,
            actions,
            self.pp_group_size,
            self.plan.makespan if in_ms else None,
            self.plan.bubble_rate,
        )
        self.measurements.append(measurement)
        self._measured_under.append(self.plan)
        if (
            self._replan_after is not None
            and self.replanned is None
            and len(self.measurements) >= self._replan_after
        ):
            self._replan()

    def _settled(self) -> list[StepMeasurement]:
        """The measured steps the ``measured_*`` figures read: all of them, but the schedule's
        first step once a later one is measured too. That step is a warm-up (PyTorch infers
        the stages' shapes, the allocator grows) and runs slower."""
        if not self.measurements:
            raise ValueError("no measured steps yet: construct with measure=True and call step()")
        if self._warmup_measured and len(self.measurements) > 1:
            return self.measurements[1:]
        return self.measurements

    def measured_profile(self) -> Profile:
        """The measured pass times as a :class:`Profile`: of every measured step but the
        schedule's first, a warm-up, when a later one is measured too.

        Memory comes from the profile the plan was made with (zeros if none).
        """
        steps = self._settled()
        times = pass_times(steps)
        fused = fused_times(steps)
        base = (
            self._costs.fit(self.plan.num_stages, self.plan.num_ranks)
            if self._costs is not None
            else None
        )
        planned = self._planned_stage_costs()
        split = {a.stage for m in steps for a in m.actions if a.kind == "I"}
        stages = []
        for s in range(self.plan.num_stages):
            f, i, w = times.get(s, (0.0, 0.0, 0.0))
            mem = base.stages[s] if base is not None else StageProfile(0, 0, 0, 0, 0)
            # What the plan was made with, for what this plan's passes do not measure.
            before = base.stages[s] if base is not None else planned[s] if planned else None
            b = fused.get(s, before.b if before is not None else None)
            if s in fused and s not in split:
                # Only fused passes ran: the split times stay those the plan was made with
                # (without them, B stands for I and W for nothing).
                i, w = (before.i, before.w) if before is not None else (b, 0.0)
            stages.append(
                StageProfile(
                    f=max(MIN_MS, f),
                    i=max(MIN_MS, i),
                    w=max(MIN_MS, w),
                    mem_b=mem.mem_b,
                    mem_w=mem.mem_w,
                    param_bytes=mem.param_bytes,
                    b=None if b is None else max(MIN_MS, b),
                )
            )
        return Profile(stages=tuple(stages), device=str(self._stages[0].device))

    def measured_comm(self) -> float | None:
        """The message latency of the steps measured so far (ms), as measured: the receiving
        rank's time between passes included (a re-plan takes what is beyond
        :meth:`measured_overhead` as ``comm``); ``None`` with one rank. See
        :func:`nobubble.torch.message_latency`."""
        return message_latency(self._settled())

    def measured_overhead(self) -> float | None:
        """The runtime's time between passes in the steps measured so far (ms), what a
        re-plan adds to every pass. See :func:`nobubble.torch.action_overhead`."""
        return action_overhead(self._settled())

    def timeline_svg(self, step: int = -1) -> str:
        """A measured step (the last by default) drawn above the plan it ran, as the simulator
        runs that plan on what the measured steps show (the median pass times of every
        measured step but the warm-up, plus the time between passes, and the link latency),
        on one time scale: an SVG picture of where the run departed from the plan (open it
        in a browser; a notebook shows it with ``IPython.display.SVG``). The plan's panel is
        thus re-simulated, not the prediction the plan was made with."""
        import nobubble

        if not self.measurements:
            raise ValueError("no measured steps yet: construct with measure=True and call step()")
        try:
            number = range(len(self.measurements))[step] + 1
        except IndexError:
            raise ValueError(
                f"step={step}: {len(self.measurements)} steps were measured (0 is the first, "
                "-1 the last)"
            ) from None
        measured = self.measurements[number - 1]
        link, overhead = self._link_and_overhead()
        comm = link or 0.0
        cost = [tuple(t + overhead for t in row) for row in self.measured_profile().cost]
        plan = self._measured_under[number - 1]
        simulated = nobubble.simulate(plan.actions, cost=cost, comm=comm, name=plan.schedule)
        rows: list[list[tuple[str, float, float]]] = [[] for _ in range(self.pp_group_size)]
        for a in measured.actions:  # in rank, start order
            rows[a.rank].append((f"{a.stage}{a.kind}{a.microbatch}", a.start_ms, a.end_ms))
        return simulated.measured_svg(
            rows,
            title=f"measured: step {number} of those measured (ms)",
            plan_title=(
                f"planned: the simulator on the measured pass times + {overhead:.3f} ms between "
                f"passes, latency {comm:.3f} ms"
            ),
        )

    def _link_and_overhead(
        self, comm: float | None = None, overhead: float | None = None
    ) -> tuple[float | None, float]:
        """The link latency and the time between passes a plan is simulated with: those given,
        else the measured ones. The measured message latency runs from a pass's end to the
        receiving pass's start, so it holds the receiver's time between passes too; that time
        goes onto every pass, so the link is what remains (``None``: no message seen)."""
        if overhead is None:
            overhead = self.measured_overhead() or 0.0
        if comm is None:
            latency = self.measured_comm()
            comm = None if latency is None else max(0.0, latency - overhead)
        return comm, overhead

    def _planned_stage_costs(self) -> list[StageProfile] | None:
        """The per-stage (F, I, W[, B]) the plan recorded as its inputs, if it did."""
        cost = (getattr(self.plan, "inputs", None) or {}).get("cost")
        n = self.plan.num_stages
        if not isinstance(cost, (list, tuple)) or len(cost) != n:
            return None
        try:
            rows = [tuple(float(x) for x in row) for row in cost]
        except (TypeError, ValueError):
            return None
        if any(len(row) not in (3, 4) for row in rows):
            return None
        # A re-planned plan's costs hold the time between passes too: take it off again.
        gap = float(self.plan.inputs.get("overhead", 0.0))
        rows = [tuple(max(MIN_MS, t - gap) for t in row) for row in rows]
        return [StageProfile(*row[:3], 0, 0, b=row[3] if len(row) == 4 else None) for row in rows]

    def replan(self, *, comm: float | None = None, overhead: float | None = None) -> PlanSnapshot:
        """Re-plans now on what the steps measured so far show (see :meth:`measured_profile`,
        :meth:`measured_comm`, :meth:`measured_overhead`); the new plan runs from the next
        step. ``comm`` (ms) replaces the measured link latency, e.g. one known for the link;
        ``overhead`` (ms) the runtime's time between passes (0: leave it out). A collective:
        call it on every rank (rank 0 plans, every rank switches). Needs ``measure=True`` and a
        measured step, and a plan that records its inputs."""
        if not self.measurements:
            raise ValueError(
                "no measured step yet: build the schedule with measure=True and run a step "
                "before re-planning"
            )
        for name, value in (("comm", comm), ("overhead", overhead)):
            if value is not None:
                check_ms(name, value)
        self._replan(comm, overhead)
        return self.plan

    def _replan(self, comm: float | None = None, overhead: float | None = None) -> None:
        """Re-plans once on the measured pass times plus the time between passes, and the
        link latency (or ``comm``, ``overhead``); every rank switches to rank 0's new plan.

        See :meth:`_link_and_overhead` for how the two are read."""
        comm, overhead = self._link_and_overhead(comm, overhead)
        cost = self.measured_profile().cost
        payload: list[Any] = [None]
        if not self._collective or dist.get_rank(self._group) == 0:
            try:
                payload[0] = replan(self.plan, cost, comm, overhead)
            except Exception as exc:  # every rank must leave the broadcast
                payload[0] = exc
        if self._collective:
            src = dist.get_global_rank(self._group, 0) if self._group is not None else 0
            dist.broadcast_object_list(payload, src=src, group=self._group)
        if isinstance(payload[0], Exception):
            raise payload[0]
        new: PlanSnapshot = payload[0]
        if new.stage_ranks != self.plan.stage_ranks:
            raise ValueError(
                "re-planning moved stages between ranks; this cannot happen with a fixed "
                "placement, please report it"
            )
        self._load_plan(new)
        self.replanned = new
        self.plan = new


# -- checks ------------------------------------------------------------------------------


#: The kinds of lowered action a forward-only iteration keeps: the forwards, their sends
#: and receives, and FSDP's unshard/reshard around them.
_FORWARD_PROGRAM = frozenset({"F", "SEND_F", "RECV_F", "WAIT_SEND_F", "UNSHARD", "RESHARD"})


def _check_stages(stages: Any) -> list[_PipelineStageBase]:
    if isinstance(stages, _PipelineStageBase):
        return [stages]
    if not isinstance(stages, (list, tuple)) or not stages:
        raise TypeError(
            "stages must be a non-empty list of this rank's PipelineStage objects, built "
            "for plan.stages_of(rank) (see nobubble.torch.build_stages)"
        )
    for s in stages:
        if not isinstance(s, _PipelineStageBase):
            raise TypeError(
                f"stages must hold torch.distributed.pipelining.PipelineStage objects; got a "
                f"{type(s).__name__}. Wrap each module: PipelineStage(module, stage_index, "
                "num_stages, device), or use nobubble.torch.build_stages"
            )
    counts = {s.num_stages for s in stages}
    if len(counts) != 1:
        raise ValueError(f"the stages disagree on num_stages ({sorted(counts)})")
    indices = [s.stage_index for s in stages]
    if len(set(indices)) != len(indices):
        raise ValueError(f"stage indices {indices} repeat; build each stage once")
    return list(stages)


# What gloo and NCCL say when the rank at the other end of a send or receive has gone.
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "ncclremoteerror")


@contextlib.contextmanager
def _peer_failures_explained() -> Iterator[None]:
    """A step whose peer rank stopped fails here with the transport's words only ("Connection
    closed by peer"); the cause is the other rank's own error (a batch that does not split,
    a missing target, ...), which only that rank can raise. Say so."""
    try:
        yield
    except RuntimeError as e:
        if any(words in str(e).lower() for words in _PEER_GONE):
            e.add_note(
                "nobubble: another rank of this pipeline stopped during step(); its own "
                "error (printed by that rank) is the cause, this rank only lost its peer"
            )
        raise


def _check_microbatches(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n_microbatches must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n_microbatches must be at least 1, got {n}")


def _check_batch(args: tuple[Any, ...], target: Any, n: int) -> None:
    for name, value in [("input", a) for a in args] + [("target", target)]:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] % n != 0:
            raise ValueError(
                f"the {name} batch has {value.shape[0]} rows, which does not split into "
                f"{n} equal microbatches; pass a batch of a multiple of {n} rows (or "
                "pre-split arg_mbs=/target_mbs= lists)"
            )


def _plan_error(
    plan: PlanSnapshot,
    stages: list[_PipelineStageBase],
    rank: int,
    size: int,
    n_microbatches: int,
) -> str | None:
    """What is wrong with running ``plan`` on this rank with these stages (None: nothing)."""
    if plan.num_ranks != size:
        return (
            f"the plan {plan.schedule!r} is for {plan.num_ranks} ranks but the pipeline group "
            f"has {size}; plan with stages={size} (nobubble.plan's pipeline rank count)"
        )
    if plan.num_microbatches != n_microbatches:
        return (
            f"the plan {plan.schedule!r} has {plan.num_microbatches} microbatches but the "
            f"schedule was given n_microbatches={n_microbatches}; pass the same count to both"
        )
    if stages[0].num_stages != plan.num_stages:
        return (
            f"the stages were built with num_stages={stages[0].num_stages} but the plan has "
            f"{plan.num_stages} stages; build PipelineStage(..., num_stages={plan.num_stages})"
        )
    want = plan.stages_of(rank)
    have = sorted(s.stage_index for s in stages)
    if have != want:
        return (
            f"rank {rank} must build stages {want} for the plan {plan.schedule!r} (its "
            f"placement: stage→rank {list(plan.stage_ranks)}), but was given stages {have}; "
            f"build PipelineStage objects for plan.stages_of({rank}) = {want}"
        )
    return None


def _agree(collective: bool, group: Any, size: int, error: str | None) -> None:
    """Raises on every rank if any rank found a problem, so no rank hangs in a collective."""
    errors = [error]
    if collective:
        errors = [None] * size
        dist.all_gather_object(errors, error, group=group)
    found = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not found:
        return
    if error is not None:
        raise ValueError(error)
    ranks = ", ".join(str(r) for r, _ in found)
    raise ValueError(f"rank(s) {ranks} cannot run the plan: {found[0][1]}")


def _is_collective(group: Any, size: int) -> bool:
    """Whether construction may use collectives (not on one rank or a fake process group)."""
    if size == 1 or not dist.is_initialized():
        return False
    return dist.get_backend(group) != "fake"


def _placement_of(stages: list[_PipelineStageBase], size: int) -> tuple[str, int | None]:
    """The layout the stages were built in, for the planner: ``("linear", None)`` for one
    stage per rank, ``("v", 2)`` when rank r holds stages r and 2p−1−r, and ``("auto", k)``
    for k stages per rank looped over the ranks (interleaved schedules: stage s on rank
    s mod p). Only this rank's stages are known here; a rank whose stages fit another
    layout is caught once the plan is made (every rank checks its own)."""
    num_stages = stages[0].num_stages
    if num_stages == size:
        return "linear", None
    if num_stages % size == 0:
        rank = stages[0].group_rank
        mine = sorted(s.stage_index for s in stages)
        if num_stages == 2 * size and mine == sorted({rank, 2 * size - 1 - rank}):
            return "v", 2
        return "auto", num_stages // size
    raise ValueError(
        f"nobubble plans one stage per rank (linear), two in a V, or k per rank looped "
        f"(interleaved), but the stages have num_stages={num_stages} on {size} ranks; build a "
        f"multiple of {size} stages, or pass plan= a plan of your own"
    )


__all__ = ["PlannedSchedule", "TESTED_TORCH"]
