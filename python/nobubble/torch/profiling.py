"""Measuring what the planner needs: each chunk's F, I, W times and M_B, M_W memory.

The planner is only as good as its costs. PyTorch's own zero-bubble schedules assume
F = I = W; real chunks are not like that (an LM head's W is large, an embedding's I is
nothing). So we time each chunk on the device it will run on, split exactly as PyTorch's
runtime splits it: I is ``stage_backward_input`` (autograd w.r.t. the chunk's inputs,
keeping the graph), W is ``stage_backward_weight`` (resuming from the saved
intermediates). As in ``PipelineStage``, the first chunk has no input gradient to send: its
I is skipped and its W runs the whole backward, so its I time is (nearly) zero and its M_W
equals its M_B. B is the fused backward (``stage_backward``, what ``Schedule1F1B`` runs),
timed in runs of its own: splitting the backward costs extra in PyTorch, and with B the
planner sees what fusing saves. Medians over several iterations after warm-up.
"""

from __future__ import annotations

import json
import operator
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from nobubble.torch._compat import stage_backward, stage_backward_input, stage_backward_weight
from nobubble.torch.memory import ActivationMemoryTracker, format_bytes

#: Smallest time reported for a pass (ms): the planner needs positive durations, and the
#: first chunk's I is a no-op in PyTorch's runtime.
MIN_MS = 1e-3

LossFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class StageProfile:
    """One chunk's measured costs: times in ms (medians), memory in bytes.

    ``mem_b`` is the activation memory one microbatch's forward leaves for its backward
    (M_B), ``mem_w`` what is still held after its input-gradient pass (M_W), ``param_bytes``
    the chunk's parameters (not activations; for information), ``b`` the fused backward's
    time (``None``: not measured, taken as I + W).
    """

    f: float
    i: float
    w: float
    mem_b: int
    mem_w: int
    param_bytes: int = 0
    b: float | None = None

    @property
    def cost(self) -> tuple[float, ...]:
        """(F, I, W), or (F, I, W, B) when B was measured: ``nobubble.plan(cost=...)``."""
        return (self.f, self.i, self.w) if self.b is None else (self.f, self.i, self.w, self.b)

    @property
    def fused(self) -> float:
        """The fused backward's time: B when measured, else I + W."""
        return self.i + self.w if self.b is None else self.b

    @property
    def mem(self) -> tuple[float, float]:
        return (float(self.mem_b), float(self.mem_w))

    def __add__(self, other: StageProfile) -> StageProfile:
        """Two chunks run as one stage: times and memory add."""
        return StageProfile(
            f=self.f + other.f,
            i=self.i + other.i,
            w=self.w + other.w,
            mem_b=self.mem_b + other.mem_b,
            mem_w=self.mem_w + other.mem_w,
            param_bytes=self.param_bytes + other.param_bytes,
            b=None if self.b is None and other.b is None else self.fused + other.fused,
        )


def _shared(s: StageProfile, k: int) -> StageProfile:
    """A chunk's share when it becomes ``k`` stages: times and memory over ``k``."""
    if k == 1:
        return s
    return StageProfile(
        f=s.f / k,
        i=s.i / k,
        w=s.w / k,
        mem_b=round(s.mem_b / k),
        mem_w=round(s.mem_w / k),
        param_bytes=round(s.param_bytes / k),
        b=None if s.b is None else s.b / k,
    )


def whole_number(name: str, value: Any) -> int:
    """``value`` as an int (numpy integers too); a float, a string or a bool is a TypeError
    naming ``name``, not silently truncated."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a whole number, got {value!r}") from None


def _positive_count(name: str, value: Any) -> int:
    """``value`` as a positive int, else a ValueError naming ``name``."""
    try:
        n = whole_number(name, value)
    except TypeError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return n


@dataclass(frozen=True)
class Profile:
    """Measured costs of a model cut into chunks, in pipeline order.

    ``cost`` and ``mem`` are what ``nobubble.plan(cost=..., mem=...)`` takes (ms and bytes,
    one entry per chunk). A plan needs one entry per stage: profile exactly as many chunks
    as the plan has stages, or more and :meth:`regroup` them (``profile`` 2p chunks, then
    ``regroup(p)`` sums neighbouring pairs for a linear plan on p ranks).
    """

    stages: tuple[StageProfile, ...]
    device: str = "cpu"
    microbatch_size: int | None = None
    iterations: int = 0
    raw_ms: tuple[tuple[tuple[float, ...], ...], ...] = field(default=(), repr=False)

    @property
    def num_chunks(self) -> int:
        return len(self.stages)

    @property
    def cost(self) -> list[tuple[float, ...]]:
        """Per chunk (F, I, W, B) in ms (B where measured), for ``nobubble.plan(cost=...)``."""
        return [s.cost for s in self.stages]

    @property
    def mem(self) -> list[tuple[float, float]]:
        """Per chunk (M_B, M_W) in bytes, for ``nobubble.plan(mem=...)``."""
        return [s.mem for s in self.stages]

    def regroup(self, num_stages: int) -> Profile:
        """The profile of the same model cut into ``num_stages`` stages of whole chunks.

        Consecutive chunks are summed (times and memory add when chunks run back to back on
        one device); the chunk count must be a multiple of ``num_stages``.
        """
        num_stages = _positive_count("num_stages", num_stages)
        n = self.num_chunks
        if num_stages == n:
            return self
        if n % num_stages != 0:
            raise ValueError(
                f"cannot regroup a profile of {n} chunks into {num_stages} stages: the chunk "
                f"count must be a multiple of the stage count; profile {num_stages} chunks, "
                f"or a multiple of {num_stages}"
            )
        k = n // num_stages
        grouped = []
        for s in range(num_stages):
            total = self.stages[s * k]
            for extra in self.stages[s * k + 1 : (s + 1) * k]:
                total = total + extra
            grouped.append(total)
        return replace(self, stages=tuple(grouped), raw_ms=())

    def fit(self, num_stages: int, num_ranks: int | None = None) -> Profile:
        """This profile read as the planner reads it for a plan of ``num_stages`` stages on
        ``num_ranks`` ranks: :meth:`regroup`-ed when the chunks are finer than the stages, or
        each chunk split evenly over the stages it becomes when they are coarser (one entry
        per rank of a V or interleaved plan: a chunk of the model in order, times and memory
        shared out). A single chunk is one rank's share, as the planner takes one entry: each
        stage gets it over the rank's ``num_stages / num_ranks`` stages (default: the
        stages are the ranks)."""
        num_stages = _positive_count("num_stages", num_stages)
        n = self.num_chunks
        if n == 1 and num_stages > 1:
            ranks = num_stages if num_ranks is None else _positive_count("num_ranks", num_ranks)
            if num_stages % ranks != 0:
                raise ValueError(f"{num_stages} stages do not share out over {ranks} ranks")
            k = num_stages // ranks
            one = self.stages[0]
            return replace(self, stages=(_shared(one, k),) * num_stages, raw_ms=())
        if num_stages <= n or num_stages % n != 0:
            return self.regroup(num_stages)
        k = num_stages // n
        split = tuple(_shared(s, k) for s in self.stages for _ in range(k))
        return replace(self, stages=split, raw_ms=())

    @staticmethod
    def average(profiles: Sequence[Profile]) -> Profile:
        """Chunk-wise mean of several ranks' profiles of the same chunks (times and memory)."""
        if not profiles:
            raise ValueError("no profiles to average")
        counts = {p.num_chunks for p in profiles}
        if len(counts) != 1:
            raise ValueError(
                f"the ranks profiled different numbers of chunks ({sorted(counts)}); profile "
                "the same chunks on every rank"
            )
        if len(profiles) == 1:
            return profiles[0]
        stages = []
        for per_rank in zip(*(p.stages for p in profiles)):
            stages.append(
                StageProfile(
                    f=statistics.fmean(s.f for s in per_rank),
                    i=statistics.fmean(s.i for s in per_rank),
                    w=statistics.fmean(s.w for s in per_rank),
                    mem_b=round(statistics.fmean(s.mem_b for s in per_rank)),
                    mem_w=round(statistics.fmean(s.mem_w for s in per_rank)),
                    param_bytes=per_rank[0].param_bytes,
                    b=None
                    if any(s.b is None for s in per_rank)
                    else statistics.fmean(s.fused for s in per_rank),
                )
            )
        return replace(profiles[0], stages=tuple(stages), raw_ms=())

    def layer_costs_json(self, comm: float = 0.0) -> str:
        """``nobubble.plan(layer_costs=...)``: this profile read as layer by layer.

        Entry 0 is the embedding, the last the LM head with the loss, the ones between the
        transformer blocks (profile ``[embedding, *blocks, head]`` as chunks). With it the
        planner also chooses how many blocks each stage holds (``plan.layer_split``); build
        the stages with :func:`~nobubble.torch.build_stages` from the same layers.
        """
        if self.num_chunks < 3:
            raise ValueError(
                f"a layer profile needs an embedding, at least one block and a head; this one "
                f"has {self.num_chunks} entries"
            )

        def entry(s: StageProfile) -> dict[str, float]:
            out = {"f": s.f, "i": s.i, "w": s.w, "mem_b": float(s.mem_b), "mem_w": float(s.mem_w)}
            return out if s.b is None else {**out, "b": s.b}

        return json.dumps(
            {
                "comm": float(comm),
                "embedding": entry(self.stages[0]),
                "blocks": [entry(s) for s in self.stages[1:-1]],
                "head": entry(self.stages[-1]),
            }
        )

    def summary(self) -> str:
        """A small table: one line per chunk."""
        lines = [
            f"{'chunk':>5} {'F ms':>9} {'I ms':>9} {'W ms':>9} {'B ms':>9} {'M_B':>11} {'M_W':>11}"
        ]
        for k, s in enumerate(self.stages):
            b = "-" if s.b is None else f"{s.b:.3f}"
            lines.append(
                f"{k:>5} {s.f:>9.3f} {s.i:>9.3f} {s.w:>9.3f} {b:>9} "
                f"{format_bytes(s.mem_b):>11} {format_bytes(s.mem_w):>11}"
            )
        return "\n".join(lines)


def profile(
    chunks: Sequence[nn.Module],
    example_microbatch: tuple[Any, Any],
    loss_fn: LossFn,
    *,
    device: torch.device | str | None = None,
    warmup: int = 2,
    iterations: int = 5,
) -> Profile:
    """Measures every chunk's F, I, W and fused-backward B times (ms) and M_B, M_W (bytes).

    ``chunks`` run in sequence (chunk k's output is chunk k+1's input; a tuple output is
    unpacked into several inputs) and the last one's output goes to
    ``loss_fn(output, target)``, as in a PyTorch pipeline. ``example_microbatch`` is
    ``(inputs, target)`` for *one microbatch*: ``inputs`` a tensor or a tuple of tensors.
    Device: ``device``, else that of the chunks' first parameter. Memory comes from the CUDA
    allocator on GPUs and from the tensors autograd saves on other devices
    (:class:`~nobubble.torch.memory.ActivationMemoryTracker`).

    Gradients already in the chunks' ``.grad`` and their buffers (BatchNorm's running
    statistics) are restored afterwards, and the RNG state is forked, so profiling does not
    change the training that follows.
    """
    if isinstance(chunks, nn.Module) and not isinstance(chunks, (nn.Sequential, nn.ModuleList)):
        raise TypeError(
            "chunks must be a list of nn.Module (one per pipeline stage); wrap a single "
            "module in a list: profile([model], ...)"
        )
    chunk_list = list(chunks)
    if not chunk_list or not all(isinstance(c, nn.Module) for c in chunk_list):
        raise TypeError("chunks must be a non-empty list of nn.Module, one per pipeline stage")
    if not (isinstance(example_microbatch, (tuple, list)) and len(example_microbatch) == 2):
        raise TypeError(
            "example_microbatch must be (inputs, target) for one microbatch, e.g. "
            "(tokens[:8], targets[:8])"
        )
    warmup = whole_number("warmup", warmup)
    iterations = whole_number("iterations", iterations)
    if warmup < 0 or iterations < 1:
        raise ValueError("warmup must be >= 0 and iterations >= 1")
    if not torch.is_grad_enabled():
        raise RuntimeError(
            "nobubble.torch.profile measures backward passes and needs autograd: call it "
            "outside torch.no_grad() / torch.inference_mode()"
        )
    dev = _resolve_device(device, chunk_list)
    inputs, target = example_microbatch
    inputs = tuple(
        _to(x, dev) for x in (inputs if isinstance(inputs, (tuple, list)) else (inputs,))
    )
    target = _to(target, dev)

    saved_grads = [[p.grad for p in c.parameters()] for c in chunk_list]
    # Buffers a forward updates (BatchNorm's running statistics and batch count).
    saved_buffers = [[b.detach().clone() for b in c.buffers()] for c in chunk_list]
    for c in chunk_list:
        for p in c.parameters():
            p.grad = None  # accumulating into them would change them in place
    rng_devices = [dev] if dev.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices):
            samples: list[list[tuple[float, float, float]]] = []
            fused: list[list[float]] = []
            for it in range(warmup + iterations):
                times = _run(chunk_list, inputs, target, loss_fn, dev, memory=False)[0]
                b_ms = _run_fused(chunk_list, inputs, target, loss_fn, dev)
                if it >= warmup:
                    samples.append(times)
                    fused.append(b_ms)
            _, mem = _run(chunk_list, inputs, target, loss_fn, dev, memory=True)
    finally:
        for c, grads, buffers in zip(chunk_list, saved_grads, saved_buffers):
            for p, g in zip(c.parameters(), grads):
                p.grad = g
            with torch.no_grad():
                for b, saved in zip(c.buffers(), buffers):
                    b.copy_(saved)

    stages = []
    raw = []
    for k, chunk in enumerate(chunk_list):
        per_pass = [[s[k][j] for s in samples] for j in range(3)]
        raw.append(tuple(tuple(x) for x in per_pass))
        f, i, w = (max(MIN_MS, statistics.median(x)) for x in per_pass)
        stages.append(
            StageProfile(
                f=f,
                i=i,
                w=w,
                mem_b=mem[k][0],
                mem_w=mem[k][1],
                param_bytes=sum(p.numel() * p.element_size() for p in chunk.parameters()),
                b=max(MIN_MS, statistics.median(b[k] for b in fused)),
            )
        )
    first = inputs[0] if inputs else None
    return Profile(
        stages=tuple(stages),
        device=str(dev),
        microbatch_size=int(first.shape[0])
        if isinstance(first, torch.Tensor) and first.dim()
        else None,
        iterations=iterations,
        raw_ms=tuple(raw),
    )


def _resolve_device(device: torch.device | str | None, chunks: list[nn.Module]) -> torch.device:
    if device is not None:
        return torch.device(device)
    for chunk in chunks:
        for p in chunk.parameters():
            return p.device
    return torch.device("cpu")


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _as_tuple(output: Any) -> tuple[Any, ...]:
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


def _stage_input(value: Any) -> Any:
    """What a receiving PipelineStage hands its module: a fresh leaf that wants a gradient."""
    if isinstance(value, torch.Tensor):
        leaf = value.detach()
        if leaf.is_floating_point() or leaf.is_complex():
            leaf.requires_grad_(True)
        return leaf
    return value


class _Clock:
    """Wall time of a pass, synchronising the GPU so queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class _Memory:
    """M_B/M_W of one chunk: CUDA allocator deltas on GPUs, saved tensors elsewhere."""

    def __init__(
        self, device: torch.device, chunk: nn.Module, enabled: bool, given: Sequence[Any] = ()
    ) -> None:
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.device = device
        # The caller's tensors (the first chunk's input, the loss's target) are not allocated
        # by the forward, and are often views of a whole batch or dataset: counting their
        # storage would charge every microbatch for all of it. The allocator does not count
        # them on a GPU either.
        given_tensors = [t for t in given if isinstance(t, torch.Tensor)]
        self.tracker = ActivationMemoryTracker(exclude=[*chunk.parameters(), *given_tensors])
        self.base = 0
        self.mem_b = 0
        self.before_i = 0

    def _allocated(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device)

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self.base = self._allocated()
        else:
            self.tracker.__enter__()

    def after_forward(self, not_activations: Sequence[Any]) -> int:
        """M_B; ``not_activations``: outputs the runtime releases once they are sent."""
        if not self.enabled:
            return 0
        if self.cuda:
            held = self._allocated() - self.base - _nbytes(not_activations)
        else:
            self.tracker.__exit__(None, None, None)
            held = self.tracker.live_bytes
        self.mem_b = max(0, held)
        return self.mem_b

    def before_input_grad(self) -> None:
        if self.enabled and self.cuda:
            self.before_i = self._allocated()

    def after_input_grad(self, created: Sequence[Any]) -> int:
        """M_W; ``created``: the input gradients I made (sent on, not held for W)."""
        if not self.enabled:
            return 0
        if not self.cuda:
            return self.tracker.live_bytes
        freed = self.before_i - (self._allocated() - _nbytes(created))
        return max(0, self.mem_b - max(0, freed))


def _nbytes(tensors: Sequence[Any]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def _run(
    chunks: list[nn.Module],
    inputs: tuple[Any, ...],
    target: Any,
    loss_fn: LossFn,
    device: torch.device,
    *,
    memory: bool,
) -> tuple[list[tuple[float, float, float]], list[tuple[int, int]]]:
    """One F of every chunk in order, then I from the last chunk back, then every W."""
    clock = _Clock(device)
    n = len(chunks)
    f_ms = [0.0] * n
    i_ms = [0.0] * n
    w_ms = [0.0] * n
    mem_b = [0] * n
    mem_w = [0] * n
    given = [inputs if k == 0 else () for k in range(n)]
    given[-1] = (*given[-1], *_as_tuple(target))
    meters = [_Memory(device, c, memory, g) for c, g in zip(chunks, given)]
    stage_inputs: list[tuple[Any, ...]] = []
    roots: list[tuple[Any, ...]] = []
    values: tuple[Any, ...] = inputs
    for k, chunk in enumerate(chunks):
        args = values if k == 0 else tuple(_stage_input(v) for v in values)
        stage_inputs.append(args)
        meters[k].start()
        t0 = clock.now()
        output = chunk(*args)
        if k == n - 1:
            output = _scalar_loss(loss_fn(output, target))
        f_ms[k] = (clock.now() - t0) * 1e3
        outputs = _as_tuple(output)
        roots.append(outputs)
        mem_b[k] = meters[k].after_forward(() if k == n - 1 else outputs)
        values = outputs
        del output

    grads: list[Any] | None = None
    param_groups: list[Any] = [None] * n
    pending_grads: list[Any] = [None] * n
    for k in reversed(range(n)):
        chunk = chunks[k]
        output_grads = None if k == n - 1 else grads
        pending_grads[k] = output_grads
        if k == 0:
            # PipelineStage skips I on the first stage (nothing to send back) and runs the
            # whole backward as its W.
            i_ms[k] = 0.0
            mem_w[k] = mem_b[k]
            break
        meters[k].before_input_grad()
        t0 = clock.now()
        dinputs, param_groups[k] = stage_backward_input(
            roots[k], output_grads, list(stage_inputs[k]), chunk.parameters()
        )
        i_ms[k] = (clock.now() - t0) * 1e3
        roots[k] = tuple(None if isinstance(r, torch.Tensor) else r for r in roots[k])
        mem_w[k] = meters[k].after_input_grad(dinputs)
        grads = list(dinputs)
        for v in stage_inputs[k]:
            if isinstance(v, torch.Tensor):
                v.grad = None

    for k in range(n):
        chunk = chunks[k]
        t0 = clock.now()
        if k == 0:
            stage_backward(roots[0], pending_grads[0], list(stage_inputs[0]))
        else:
            stage_backward_weight(chunk.parameters(), param_groups[k])
        w_ms[k] = (clock.now() - t0) * 1e3
        param_groups[k] = None
    for c in chunks:
        for p in c.parameters():
            p.grad = None
    return list(zip(f_ms, i_ms, w_ms)), list(zip(mem_b, mem_w))


def _run_fused(
    chunks: list[nn.Module],
    inputs: tuple[Any, ...],
    target: Any,
    loss_fn: LossFn,
    device: torch.device,
) -> list[float]:
    """One F of every chunk, then each chunk's fused backward (B) from the last back: ms."""
    clock = _Clock(device)
    n = len(chunks)
    stage_inputs: list[tuple[Any, ...]] = []
    roots: list[tuple[Any, ...]] = []
    values: tuple[Any, ...] = inputs
    for k, chunk in enumerate(chunks):
        args = values if k == 0 else tuple(_stage_input(v) for v in values)
        stage_inputs.append(args)
        output = chunk(*args)
        if k == n - 1:
            output = _scalar_loss(loss_fn(output, target))
        roots.append(_as_tuple(output))
        values = roots[-1]
    b_ms = [0.0] * n
    grads: Any = None
    for k in reversed(range(n)):
        t0 = clock.now()
        # The loss starts the backward with no incoming gradient (a tuple of outputs with
        # None for its gradients would be skipped whole).
        output: Any = roots[k][0] if k == n - 1 else roots[k]
        grads = list(stage_backward(output, None if k == n - 1 else grads, list(stage_inputs[k])))
        b_ms[k] = (clock.now() - t0) * 1e3
        roots[k] = ()
    for c in chunks:
        for p in c.parameters():
            p.grad = None
    return b_ms


def _scalar_loss(loss: Any) -> Any:
    """``loss_fn``'s result, which the backward starts from: a tensor of one element, as
    PyTorch's pipeline schedules need too (their own error for another is an internal one)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = (
            f"a tensor of shape {tuple(loss.shape)}"
            if isinstance(loss, torch.Tensor)
            else (type(loss).__name__)
        )
        raise ValueError(
            f"loss_fn returned {what}; it must return one number (a tensor of one element): "
            "reduce it, e.g. with .mean() or reduction='mean'"
        )
    return loss
