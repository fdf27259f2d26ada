"""Tokens/s of PyTorch's pipeline runtime under a nobubble plan against PyTorch's schedules.

    python python/bench/bench_torch.py                 # spawns 2 ranks itself
    torchrun --nproc-per-node 2 python/bench/bench_torch.py

The workload: a byte-level GPT (4 blocks, hidden 256, 4 heads, sequence 128; ``--arch llama``:
Llama blocks, 2 K/V heads, SwiGLU of width 704), microbatches of
8 sequences, 8 microbatches per step, fp32, AdamW, 2 ranks of 1 thread each (CPU, gloo).
The model is cut into 4 chunks (embedding + block 0, block 1, block 2, block 3 + head) and
the same chunks run under

- ``nobubble``: zb-auto planned on the chunks' profiled costs (linear or V, whichever
  the planner predicts faster), run by ``PlannedSchedule``;
- ``nobubble, planned cut``: zb-auto planned on a per-layer profile, so the planner also
  chooses how many blocks each stage holds (the embedding stays first, the head last);
- ``nobubble, re-planned``: the first plan re-planned after two measured steps (after the
  warm-up) on the pass times PyTorch's runtime showed, alone or with the message latency
  and the time between passes those steps showed;
- ``Schedule1F1B``: pairs of chunks, one stage per rank;
- ``ScheduleInterleavedZeroBubble``: 4 stages, rank r holds stages r and r+2;
- ``ScheduleZBVZeroBubble``: 4 stages in a V, rank r holds stages r and 3−r.

Rounds alternate between the schedules (each round runs every schedule for a few steps, in
a rotated order), so slow drifts of the machine hit all of them alike; the median step
time counts. Two variants: ``uniform`` (byte vocabulary: stages alike) and ``hetero`` (a
32k vocabulary: the embedding and LM-head chunks are much heavier), where schedules that
assume F = I = W lose and the planner, which plans with the measured costs (and may
move blocks away from the head's stage), should not.
Every step is timed from a barrier to a barrier (the optimizer step included).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import nobubble.torch as nbt
from nobubble.torch.models import (
    SAMPLE_TEXT,
    GPTConfig,
    byte_batches,
    gpt_chunks,
    gpt_layers,
    lm_loss,
)
from nobubble.torch.profiling import MIN_MS

RANKS = 2
CHUNKS = 4


@dataclass
class Setup:
    """One schedule with its own copy of the model and its own optimizer."""

    name: str
    schedule: Any
    stages: list[Any]
    optimizer: torch.optim.Optimizer
    predicted_ms: float | None
    note: str = ""
    #: Re-plan after the warm-up's measured steps: with this latency (ms) and no time between
    #: passes, or ``None`` for the measured latency and time between passes; not re-planned
    #: when ``replan`` is false.
    replan: bool = False
    replan_comm: float | None = None

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)


def _pipeline_stages(chunks: list[nn.Module], indices: list[int]) -> list[Any]:
    from torch.distributed.pipelining import PipelineStage

    return [PipelineStage(chunks[s], s, len(chunks), torch.device("cpu")) for s in indices]


def _predict(name: str, prof: nbt.Profile, m: int, placement: str) -> float | None:
    """The planner's simulated step time of PyTorch's own schedule on the measured costs."""
    try:
        import nobubble

        costs = prof if placement == "v" or placement == "loop" else prof.regroup(RANKS)
        kwargs: dict[str, Any] = {"cost": costs.cost, "mem": costs.mem}
        return float(nobubble.plan(name, stages=RANKS, microbatches=m, **kwargs).makespan)
    except Exception:  # the planner may not model every class; the figure is optional
        return None


def _kind(plan: Any) -> str:
    """The plan's layout, and how many of its backward passes are fused."""
    placement = "V" if plan.num_stages == 2 * RANKS else "linear"
    fused = sum("B" in a for row in plan.actions for a in row)
    return f"{placement} plan" + (f", {fused} fused backward passes" if fused else "")


def build_setups(cfg: GPTConfig, m: int, mb: int, rank: int) -> tuple[list[Setup], nbt.Profile]:
    def fresh() -> list[nn.Module]:
        return gpt_chunks(cfg, CHUNKS, seed=0)

    ((x, y),) = byte_batches(SAMPLE_TEXT, mb, cfg.seq_len, 1, seed=1)
    local = nbt.profile(fresh(), (x, y), lm_loss, warmup=2, iterations=5)
    # Every prediction (and the plan) from the same costs: the mean of both ranks' profiles.
    gathered: list[Any] = [None] * RANKS
    dist.all_gather_object(gathered, local)
    prof = nbt.Profile.average(gathered)
    setups: list[Setup] = []

    # Steps are timed barrier to barrier here, so the makespan is what is paid.
    skip_cut = os.environ.get("NOBUBBLE_BENCH_SKIP_CUT") == "1"
    plan = nbt.agreed_plan("zb-auto", microbatches=m, costs=prof, objective="makespan")
    chunks = fresh()
    stages = nbt.build_stages(chunks, plan)
    sched = nbt.PlannedSchedule(stages, m, lm_loss, plan=plan)
    setups.append(_setup("nobubble zb-auto", sched, stages, plan.makespan, _kind(plan)))

    # Re-planned on what two measured steps of PyTorch's runtime show: the pass times alone
    # (latency 0, as the profile plans) and with the message latency and the runtime's time
    # between passes the steps show.
    first = plan
    for label, comm in (("pass times", 0.0), ("measured", None)):
        chunks = fresh()
        stages = nbt.build_stages(chunks, first)
        sched = nbt.PlannedSchedule(stages, m, lm_loss, plan=first, measure=True)
        setup = _setup(f"nobubble zb-auto, re-planned: {label}", sched, stages, None)
        setup.replan, setup.replan_comm = True, comm
        setups.append(setup)

    # The same planner blind to the fused backward's cost (B priced as I + W), as before the
    # profile measured B: what fusing gains.
    split_prof = dataclasses.replace(
        prof, stages=tuple(dataclasses.replace(s, b=None) for s in prof.stages)
    )
    plan = nbt.agreed_plan("zb-auto", microbatches=m, costs=split_prof, objective="makespan")
    chunks = fresh()
    stages = nbt.build_stages(chunks, plan)
    sched = nbt.PlannedSchedule(stages, m, lm_loss, plan=plan)
    setups.append(_setup("nobubble zb-auto, B = I + W", sched, stages, plan.makespan, _kind(plan)))

    # The planner may also move blocks between stages, from a per-layer profile.
    if skip_cut:
        return _fixed_setups(cfg, m, rank, prof, fresh, setups), prof
    layers = gpt_layers(cfg, seed=0)
    local_layers = nbt.profile(layers, (x, y), lm_loss, warmup=2, iterations=5)
    split_plan = nbt.agreed_plan(
        "zb-auto", microbatches=m, layers=local_layers, objective="makespan"
    )
    stages = nbt.build_stages(layers, split_plan)
    sched = nbt.PlannedSchedule(stages, m, lm_loss, plan=split_plan)
    kind = "V" if split_plan.num_stages == 2 * RANKS else "linear"
    split = ",".join(str(b) for b in split_plan.layer_split or ())
    setups.append(
        _setup(
            "nobubble zb-auto, planned cut",
            sched,
            stages,
            split_plan.makespan,
            f"{kind}, blocks per stage {split}",
        )
    )

    return _fixed_setups(cfg, m, rank, prof, fresh, setups), prof


def _fixed_setups(
    cfg: GPTConfig, m: int, rank: int, prof: nbt.Profile, fresh: Any, setups: list[Setup]
) -> list[Setup]:
    """PyTorch's own schedules on the same chunks, appended to ``setups``."""
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )

    pairs = nbt.split_layers(fresh(), RANKS)
    stages = _pipeline_stages(pairs, [rank])
    setups.append(
        _setup(
            "Schedule1F1B",
            Schedule1F1B(stages[0], m, lm_loss),
            stages,
            _predict("1f1b", prof, m, "linear"),
        )
    )
    stages = _pipeline_stages(fresh(), [rank, rank + RANKS])
    setups.append(
        _setup(
            "ScheduleInterleavedZeroBubble",
            ScheduleInterleavedZeroBubble(stages, m, lm_loss),
            stages,
            _predict("interleaved-zb", prof, m, "loop"),
        )
    )
    stages = _pipeline_stages(fresh(), [rank, 2 * RANKS - 1 - rank])
    setups.append(
        _setup(
            "ScheduleZBVZeroBubble",
            ScheduleZBVZeroBubble(stages, m, lm_loss),
            stages,
            _predict("zb-v", prof, m, "v"),
        )
    )
    return setups


def _setup(
    name: str, schedule: Any, stages: list[Any], predicted: float | None, note: str = ""
) -> Setup:
    params = [p for s in stages for p in s.submod.parameters()]
    return Setup(name, schedule, stages, torch.optim.AdamW(params, lr=1e-3), predicted, note)


def timed_step(setup: Setup, x: torch.Tensor, y: torch.Tensor) -> float:
    dist.barrier()
    start = time.perf_counter()
    setup.optimizer.zero_grad(set_to_none=True)
    # return_outputs=False: merging the last stage's outputs (the logits of every
    # microbatch) is a large copy no training loop needs.
    setup.schedule.step(
        *((x,) if setup.has_first else ()),
        target=y if setup.has_last else None,
        losses=[],
        return_outputs=False,
    )
    setup.optimizer.step()
    dist.barrier()
    return (time.perf_counter() - start) * 1e3


def run_variant(name: str, cfg: GPTConfig, args: argparse.Namespace, rank: int) -> None:
    m, mb = args.microbatches, args.microbatch_size
    setups, prof = build_setups(cfg, m, mb, rank)
    batches = byte_batches(SAMPLE_TEXT, m * mb, cfg.seq_len, 4, seed=2)
    times: dict[str, list[float]] = {s.name: [] for s in setups}
    for s in setups:  # warm-up: metadata inference, allocator
        timed_step(s, *batches[0])
        if s.replan:  # the warm-up step is measured too, but a re-plan leaves it out
            timed_step(s, *batches[1])
            timed_step(s, *batches[2])
            measured = s.replan_comm is None  # else pass times alone: no time between passes
            new = s.schedule.replan(comm=s.replan_comm, overhead=None if measured else 0.0)
            s.schedule.measure = False
            s.predicted_ms = new.makespan
            comm, gap = new.inputs.get("comm", 0.0), new.inputs["overhead"]
            s.note = f"{_kind(new)}, comm {comm:.3f} ms, {gap:.3f} ms between passes"
    for r in range(args.rounds):
        order = setups[r % len(setups) :] + setups[: r % len(setups)]
        for s in order:
            for k in range(args.steps):
                times[s.name].append(timed_step(s, *batches[(r + k) % len(batches)]))
    # One more step of the first setup with every action timed (not in the figures above:
    # timing adds a barrier and an all-gather to the step).
    setups[0].schedule.measure = True
    timed_step(setups[0], *batches[0])
    setups[0].schedule.measure = False
    # The plan re-planned with the latency: its measured passes against its prediction with
    # that latency and without it (the same plan and pass times, simulated with comm 0).
    latency = next((s for s in setups if s.replan and s.replan_comm is None), None)
    if latency is not None:
        latency.schedule.measure = True
        for k in range(3):
            timed_step(latency, *batches[k % len(batches)])
        latency.schedule.measure = False
    if rank != 0:
        return
    measured = setups[0].schedule.measurements[-1]
    tokens = m * mb * cfg.seq_len
    if args.json:
        import json

        medians = {s.name: statistics.median(times[s.name]) for s in setups}
        with open(args.json, "a") as f:
            f.write(json.dumps({"variant": name, "tokens": tokens, "step_ms": medians}) + "\n")
    print(
        f"\n== {name}: vocab {cfg.vocab}, {cfg.blocks} blocks, hidden {cfg.hidden}, "
        f"seq {cfg.seq_len}, microbatch {mb}, m = {m}, {RANKS} ranks × 1 thread"
    )
    print("profiled costs per chunk (median of 5 after 2 warm-up, mean of the 2 ranks):")
    print(prof.summary())
    print(f"{'schedule':44} {'tokens/s':>9} {'step ms':>9} {'min ms':>8} {'predicted':>10}  note")
    base = statistics.median(times["Schedule1F1B"])
    for s in setups:
        med = statistics.median(times[s.name])
        pred = "n/a" if s.predicted_ms is None else f"{s.predicted_ms:.1f}"
        print(
            f"{s.name:44} {tokens / med * 1e3:>9.0f} {med:>9.1f} {min(times[s.name]):>8.1f} "
            f"{pred:>10}  {s.note} ({base / med:.2f}× 1F1B)"
        )
    if latency is not None:
        import nobubble

        plan = latency.schedule.plan
        passes = statistics.median(x.makespan_ms for x in latency.schedule.measurements[-3:])
        gap, comm = plan.inputs["overhead"], plan.inputs.get("comm", 0.0)
        bare = [tuple(max(MIN_MS, t - gap) for t in row) for row in plan.inputs["cost"]]

        def error(cost: Any, comm: float) -> str:
            ms = nobubble.simulate(plan.actions, cost=cost, comm=comm).makespan
            return f"{ms:.1f} ms ({ms / passes - 1:+.1%})"

        print(
            f"{latency.name}: its passes end at {passes:.1f} ms (median of 3 measured steps); "
            f"predicted on pass times alone {error(bare, 0.0)}, with the latency "
            f"{comm:.3f} ms {error(bare, comm)}, with {gap:.3f} ms between passes too "
            f"{error(plan.inputs['cost'], comm)}"
        )
    busy = ", ".join(f"{b:.0f}" for b in measured.busy_ms)
    print(
        f"nobubble, last measured step: {measured.summary()}; compute per rank {busy} ms "
        f"(planned {sum(sum(c[:3]) for c in prof.cost) * m / RANKS:.0f} ms on average)"
    )


def worker(rank: int, world: int, store: str | None, args: argparse.Namespace) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    if store is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        for variant in args.variants.split(","):
            vocab = 256 if variant == "uniform" else args.hetero_vocab
            cfg = GPTConfig(
                vocab=vocab, hidden=256, heads=4, blocks=4, seq_len=args.seq_len, arch=args.arch
            )
            run_variant(variant, cfg, args, rank)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="nobubble vs PyTorch pipeline schedules")
    parser.add_argument("--variants", default="uniform,hetero")
    parser.add_argument(
        "--arch", default="gpt", choices=["gpt", "llama"], help="GPT blocks or Llama blocks"
    )
    parser.add_argument("--hetero-vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="steps per schedule per round")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--json", help="append each variant's median step times as a JSON line")
    parser.add_argument(
        "--skip-planned-cut", action="store_true", help="leave out the per-layer planned cut"
    )
    args = parser.parse_args()
    if args.skip_planned_cut:
        os.environ["NOBUBBLE_BENCH_SKIP_CUT"] = "1"  # inherited by the spawned ranks
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker,
            args=(RANKS, f"{tmp}/store", args),
            nprocs=RANKS,
            join=True,
            start_method="spawn",
        )


if __name__ == "__main__":
    main()
