"""Single-process tests of nobubble.torch: profiling, plans, stage building, errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import nobubble.torch as nbt  # noqa: E402
from nobubble.torch.models import (  # noqa: E402
    SAMPLE_TEXT,
    GPTConfig,
    byte_batches,
    gpt_chunks,
    gpt_layers,
    lm_loss,
)
from nobubble.torch.timing import ActionTiming, on_one_clock, summarize  # noqa: E402

CFG = GPTConfig(vocab=256, hidden=32, heads=2, blocks=4, seq_len=16)


def _example(batch: int) -> tuple[Any, Any]:
    ((x, y),) = byte_batches(SAMPLE_TEXT, batch, CFG.seq_len, 1, seed=3)
    return x, y


# -- profiling ---------------------------------------------------------------------------


def test_profile_times_are_positive_and_split_like_pytorch() -> None:
    """Every pass takes time; the first chunk's I is PyTorch's no-op (its W is the whole B)."""
    chunks = gpt_chunks(CFG, 2)
    prof = nbt.profile(chunks, _example(2), lm_loss, warmup=1, iterations=3)
    assert prof.num_chunks == 2
    assert prof.microbatch_size == 2
    for s in prof.stages:
        assert s.f > 0 and s.i > 0 and s.w > 0
        assert s.mem_b > 0 and 0 < s.mem_w <= s.mem_b
        assert s.param_bytes > 0
    first, last = prof.stages
    assert first.i == nbt.profiling.MIN_MS
    assert first.mem_w == first.mem_b
    assert last.i > 10 * nbt.profiling.MIN_MS
    assert len(prof.cost) == 2 and len(prof.mem) == 2
    assert prof.cost[1] == (last.f, last.i, last.w, last.b)
    # The fused backward is timed in runs of its own, for every chunk.
    assert all(s.b is not None and s.b >= nbt.profiling.MIN_MS for s in prof.stages)


def test_profile_names_a_loss_that_is_not_one_number() -> None:
    """An unreduced loss (reduction='none') is a clear ValueError, not autograd's own error."""
    chunks = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def per_element(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, target, reduction="none")

    with pytest.raises(ValueError, match=r"shape \(4, 8\).*one number"):
        nbt.profile(chunks, (x, y), per_element, warmup=0, iterations=1)


def test_profile_memory_grows_with_microbatch_size() -> None:
    """Activation memory is per microbatch: 4 samples hold about twice what 2 do."""
    chunks = gpt_chunks(CFG, 2)
    small = nbt.profile(chunks, _example(2), lm_loss, warmup=0, iterations=1)
    large = nbt.profile(chunks, _example(4), lm_loss, warmup=0, iterations=1)
    for a, b in zip(small.stages, large.stages):
        assert b.mem_b > 1.8 * a.mem_b
        assert b.mem_w > 1.8 * a.mem_w


def test_profile_leaves_gradients_and_rng_untouched() -> None:
    """Profiling must not change the training that follows."""
    chunks = gpt_chunks(CFG, 2)
    for p in chunks[0].parameters():
        p.grad = torch.full_like(p, 0.5)
    state = torch.random.get_rng_state()
    nbt.profile(chunks, _example(2), lm_loss, warmup=0, iterations=1)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.all(p.grad == 0.5) for p in chunks[0].parameters())
    assert all(p.grad is None for p in chunks[1].parameters())


def test_profile_leaves_running_statistics_untouched() -> None:
    """A forward in training mode updates BatchNorm's buffers; profiling puts them back."""

    class Normed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.norm = torch.nn.BatchNorm1d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.lin(x))

    chunks = [Normed(), Normed()]
    before = [{k: v.clone() for k, v in c.state_dict().items()} for c in chunks]
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    nbt.profile(chunks, (x, y), torch.nn.functional.mse_loss, warmup=1, iterations=2)
    for c, saved in zip(chunks, before):
        for k, v in c.state_dict().items():
            assert torch.equal(v, saved[k]), k


def test_profile_regroup_sums_neighbouring_chunks() -> None:
    """Profile 2p chunks, plan p stages: pairs add up (times and memory)."""
    prof = nbt.profile(gpt_chunks(CFG, 4), _example(2), lm_loss, warmup=0, iterations=1)
    two = prof.regroup(2)
    assert two.num_chunks == 2
    assert two.stages[0].f == pytest.approx(prof.stages[0].f + prof.stages[1].f)
    assert two.stages[1].mem_b == prof.stages[2].mem_b + prof.stages[3].mem_b
    with pytest.raises(ValueError, match="multiple of the stage count"):
        prof.regroup(3)
    with pytest.raises(ValueError, match="positive whole number, got 0"):
        prof.regroup(0)


def test_profile_average_across_ranks() -> None:
    a = nbt.Profile(stages=(nbt.StageProfile(1.0, 2.0, 3.0, 10, 4),))
    b = nbt.Profile(stages=(nbt.StageProfile(3.0, 4.0, 5.0, 20, 6),))
    mean = nbt.Profile.average([a, b])
    assert mean.stages[0].cost == (2.0, 3.0, 4.0)
    assert mean.stages[0].mem == (15.0, 5.0)
    with pytest.raises(ValueError, match="different numbers of chunks"):
        nbt.Profile.average([a, nbt.Profile(stages=a.stages * 2)])


def test_profile_rejects_bad_arguments() -> None:
    chunks = gpt_chunks(CFG, 2)
    with pytest.raises(TypeError, match="list of nn.Module"):
        nbt.profile(["not a module"], _example(2), lm_loss)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"\(inputs, target\)"):
        nbt.profile(chunks, _example(2)[0], lm_loss)


def test_activation_tracker_counts_unique_storages_and_frees() -> None:
    """Views share a storage (counted once); parameters are excluded; backward frees."""
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    tracker = nbt.ActivationMemoryTracker(exclude=lin.parameters())
    with tracker:
        y = lin(x)
        z = (y.view(-1) * y.view(-1)).sum()
    assert tracker.live_bytes == x.numel() * 4 + y.numel() * 4
    z.backward()
    del y, z
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == x.numel() * 4 + y_size_bytes(lin, x)


def y_size_bytes(lin: nn.Linear, x: torch.Tensor) -> int:
    return x.shape[0] * lin.out_features * 4


# -- plans -------------------------------------------------------------------------------

ZB_H1 = (
    "0F0,0F1,0I0,0W0,0F2,0I1,0W1,0F3,0I2,0W2,0I3,0W3\n"
    "1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n"
)
V_CSV = (
    "0F0,0F1,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1\n"
    "1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,2I1,2W1,1I1,1W1\n"
)


def test_plan_from_csv_reads_placement_and_counts() -> None:
    plan = nbt.plan_from_csv(ZB_H1)
    assert (plan.num_ranks, plan.num_stages, plan.num_microbatches) == (2, 2, 4)
    assert plan.stages_of(1) == [1] and plan.rank_of(0) == 0
    assert plan.to_csv() == ZB_H1
    v = nbt.plan_from_csv(V_CSV)
    assert v.stages_of(0) == [0, 3] and v.stages_of(1) == [1, 2]
    assert v.digest() != plan.digest()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0X1\n", "not a PyTorch action"),
        ("0F0,0B0\n1F0,0B0\n", "appears in rows"),
        ("", "no actions"),
        ("0F0,0SEND_F0\n", "not a compute action"),
    ],
)
def test_plan_from_csv_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nbt.plan_from_csv(text)


def test_snapshot_of_the_planner_result() -> None:
    """PlanSnapshot keeps what every rank needs and the planner's predictions."""
    nobubble = pytest.importorskip("nobubble")
    plan = nobubble.plan("zb-v", stages=2, microbatches=4)
    snap = nbt.PlanSnapshot.of(plan)
    assert snap.num_stages == 4 and snap.stages_of(0) == [0, 3]
    assert snap.actions == tuple(tuple(r) for r in plan.actions)
    assert snap.makespan == pytest.approx(plan.makespan)
    assert nbt.PlanSnapshot.of(snap) is snap
    with pytest.raises(TypeError, match="nobubble plan"):
        nbt.PlanSnapshot.of(object())


# -- stages ------------------------------------------------------------------------------


def test_split_layers_contiguous_and_balanced() -> None:
    layers = gpt_layers(CFG)
    chunks = nbt.split_layers(layers, 4)
    assert [len(c) for c in chunks] == [2, 2, 1, 1]  # type: ignore[arg-type]
    assert nbt.split_layers(layers, len(layers)) == layers
    with pytest.raises(ValueError, match="at least one layer per stage"):
        nbt.split_layers(layers[:2], 3)


def test_stage_modules_follow_the_plan() -> None:
    v = nbt.plan_from_csv(V_CSV)
    chunks = gpt_chunks(CFG, 4)
    mods = nbt.stage_modules(chunks, v, rank=1)
    assert sorted(mods) == [1, 2] and mods[2] is chunks[2]


def test_layer_profile_lets_the_planner_cut() -> None:
    """Per-layer costs: the planner chooses blocks per stage; build_stages cuts the same way."""
    nobubble = pytest.importorskip("nobubble")
    layers = gpt_layers(CFG)
    prof = nbt.profile(layers, _example(2), lm_loss, warmup=0, iterations=1)
    doc = json.loads(prof.layer_costs_json())
    assert len(doc["blocks"]) == CFG.blocks and doc["head"]["f"] == prof.stages[-1].f
    heavy = nbt.Profile(
        stages=(
            nbt.StageProfile(0.1, 0.001, 0.5, 10, 10),
            *[nbt.StageProfile(1.0, 1.0, 1.0, 100, 50)] * CFG.blocks,
            nbt.StageProfile(3.0, 3.0, 3.0, 400, 40),
        )
    )
    plan = nbt.make_plan(
        "zb-auto", num_ranks=2, num_microbatches=4, layers=heavy, placement="linear"
    )
    assert plan.layer_split is not None and sum(plan.layer_split) == CFG.blocks
    assert plan.layer_split[0] > plan.layer_split[1]  # the head's stage gets fewer blocks
    assert plan.inputs["placement"] == "linear" and len(plan.inputs["cost"]) == 2
    mods = nbt.stage_modules(layers, plan, rank=1)
    assert list(mods[1])[-1] is layers[-1]  # type: ignore[call-overload]
    assert len(list(mods[1])) == plan.layer_split[1] + 1  # type: ignore[call-overload]
    half = 1 + CFG.blocks // 2  # the even cut: embedding + half the blocks | rest + head
    stage0, stage1 = heavy.stages[:half], heavy.stages[half:]
    even_cost = [tuple(sum(x.cost[j] for x in st) for j in range(3)) for st in (stage0, stage1)]
    even = nobubble.plan("zb-auto", 2, 4, cost=even_cost, placement="linear")
    assert plan.makespan is not None and plan.makespan < even.makespan
    with pytest.raises(ValueError, match="layer split"):
        nbt.cut_by_layer_split(layers[:-1], plan.layer_split)


# -- errors of PlannedSchedule (single process, PyTorch's fake process group) --------------


@pytest.fixture
def fake_rank1_of_2() -> Any:
    """A fake two-rank process group in which this process is rank 1 (no peers needed)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    yield
    dist.destroy_process_group()


def test_wrong_stages_for_rank_names_the_right_ones(fake_rank1_of_2: None) -> None:
    from torch.distributed.pipelining import PipelineStage

    plan = nbt.plan_from_csv(V_CSV)
    chunks = gpt_chunks(CFG, 4)
    stages = [PipelineStage(chunks[s], s, 4, torch.device("cpu")) for s in (1, 3)]
    with pytest.raises(ValueError, match=r"rank 1 must build stages \[1, 2\]"):
        nbt.PlannedSchedule(stages, 2, lm_loss, plan=plan)


def test_wrong_counts_and_types(fake_rank1_of_2: None) -> None:
    from torch.distributed.pipelining import PipelineStage

    plan = nbt.plan_from_csv(V_CSV)
    stages = nbt.build_stages(gpt_chunks(CFG, 4), plan)
    with pytest.raises(ValueError, match="n_microbatches=3"):
        nbt.PlannedSchedule(stages, 3, lm_loss, plan=plan)
    with pytest.raises(TypeError, match="PipelineStage"):
        nbt.PlannedSchedule([nn.Linear(2, 2)], 2, lm_loss, plan=plan)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="n_microbatches must be an int"):
        nbt.PlannedSchedule(stages, 2.0, lm_loss, plan=plan)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        nbt.PlannedSchedule(stages, 2, lm_loss, plan=plan, schedule="zb-auto")
    linear = nbt.plan_from_csv(ZB_H1)
    two = [PipelineStage(gpt_chunks(CFG, 2)[1], 1, 2, torch.device("cpu"))]
    with pytest.raises(ValueError, match="num_stages=2 but the plan has 4"):
        nbt.PlannedSchedule(two, 2, lm_loss, plan=plan)
    with pytest.raises(
        ValueError, match="replan_after needs a plan that records how it was planned"
    ):
        nbt.PlannedSchedule(two, 4, lm_loss, plan=linear, replan_after=1)
    three = nbt.plan_from_csv("0F0,0B0\n1F0,1B0\n2F0,2B0\n")
    with pytest.raises(ValueError, match="for 3 ranks but the pipeline group has 2"):
        nbt.PlannedSchedule(two, 1, lm_loss, plan=three)


def test_schedule_builds_on_fake_group(fake_rank1_of_2: None) -> None:
    """A valid plan is accepted and lowered by PyTorch (sends/receives added)."""
    plan = nbt.plan_from_csv(V_CSV)
    stages = nbt.build_stages(gpt_chunks(CFG, 4), plan)
    schedule = nbt.PlannedSchedule(stages, 2, lm_loss, plan=plan)
    lowered = [str(a) for a in schedule.pipeline_order_with_comms[1]]
    assert any("SEND_F" in a for a in lowered) and any("RECV_B" in a for a in lowered)
    assert schedule.plan.digest() == plan.digest()


# -- measurement summaries ----------------------------------------------------------------


def test_summary_and_trace_format(tmp_path: Path) -> None:
    acts = [
        ActionTiming(0, 0, "F", 0, 0.0, 1.0),
        ActionTiming(0, 0, "I", 0, 3.0, 4.0),
        ActionTiming(1, 1, "F", 0, 1.0, 2.0),
        ActionTiming(1, 1, "I", 0, 2.0, 3.0),
    ]
    m = summarize([4.5, 4.0], acts, 2, predicted_ms=4.0, predicted_bubble_rate=0.25)
    assert m.step_ms == 4.5 and m.makespan_ms == 4.0
    assert m.busy_ms == (2.0, 2.0) and m.span_ms == (4.0, 2.0)
    assert m.bubble_rate == pytest.approx(0.5)
    assert m.bubble_fraction == pytest.approx(0.5)
    assert m.pass_times()[0] == (1.0, 1.0, 0.0)
    nbt.write_trace(tmp_path / "t.json", [m])
    trace = json.loads((tmp_path / "t.json").read_text())
    first = trace["traceEvents"][0]
    assert first == {
        "name": "F0",
        "cat": "F",
        "ph": "X",
        "pid": 0,
        "tid": 0,
        "ts": 0.0,
        "dur": 1000.0,
        "args": {"stage": 0, "microbatch": 0, "step": 0},
    }
    assert "planned 4.00 ms" in m.summary()


def test_message_latency_reads_the_gaps_a_waiting_receiver_shows() -> None:
    """Two ranks, two microbatches. Where the receiver was waiting, rank 0 → 1 gaps are
    [0.25] and rank 1 → 0 ones [0.35, 0.25] (the last into a fused B): the latency is the
    mean of the two directions' medians, 0.275. F(1, 1) starts 2 ms after its sender because
    rank 1 was still busy: that gap says nothing about the link, and counting it would give
    0.7125 (missing the I → B message, 0.3). Shifting one rank's clock, as the barrier's
    skew does, changes nothing."""
    acts = [
        ActionTiming(0, 0, "F", 0, 0.0, 1.0),
        ActionTiming(0, 0, "F", 1, 1.0, 2.0),
        ActionTiming(1, 1, "F", 0, 1.25, 2.25),  # waiting since the start: 0.25
        ActionTiming(1, 1, "F", 1, 4.0, 5.0),  # busy until 2.25, its sender ended at 2
        ActionTiming(1, 1, "I", 0, 5.0, 5.25),
        ActionTiming(1, 1, "I", 1, 5.25, 6.0),
        ActionTiming(0, 0, "I", 0, 5.6, 5.9),  # waiting since 2: 0.35
        ActionTiming(0, 0, "B", 1, 6.25, 7.25),  # waiting since 5.9: 0.25
        ActionTiming(1, 1, "W", 0, 6.0, 7.0),
    ]
    m = summarize([8.0, 8.0], acts, 2, predicted_ms=None, predicted_bubble_rate=None)
    assert nbt.message_latency([m]) == pytest.approx(0.275)
    assert m.message_latency() == pytest.approx(0.275)
    assert "message latency 0.275 ms" in m.summary()
    skewed = [
        dataclasses.replace(a, start_ms=a.start_ms + 0.2, end_ms=a.end_ms + 0.2)
        if a.rank == 1
        else a
        for a in acts
    ]
    again = summarize([8.0, 8.0], skewed, 2, None, None)
    assert nbt.message_latency([again]) == pytest.approx(0.275)
    # Two steps: each direction's gaps pooled over both.
    assert nbt.message_latency([m, again]) == pytest.approx(0.275)
    one_rank = [ActionTiming(0, 0, "F", 0, 0.0, 1.0), ActionTiming(0, 0, "I", 0, 1.0, 2.0)]
    alone = summarize([2.0], one_rank, 1, None, None)
    assert nbt.message_latency([alone]) is None
    assert "message latency" not in alone.summary()


def test_ranks_on_one_host_are_put_on_one_clock() -> None:
    """Rank 1 left the barrier 2 ms after rank 0: on one host its actions move 2 ms later
    (on rank 0's axis); on two hosts, or with origins a barrier cannot explain, they stay."""
    row0 = [ActionTiming(0, 0, "F", 0, 0.0, 1.0)]
    row1 = [ActionTiming(1, 1, "F", 0, 0.5, 1.5)]
    same = on_one_clock([row0, row1], [100.000, 100.002], ["a", "a"])
    assert same[0] == row0[0]
    assert (same[1].start_ms, same[1].end_ms) == pytest.approx((2.5, 3.5))
    earlier = on_one_clock([row0, row1], [100.002, 100.000], ["a", "a"])
    assert earlier[0].start_ms == pytest.approx(2.0) and earlier[1] == row1[0]
    assert on_one_clock([row0, row1], [100.0, 100.002], ["a", "b"]) == row0 + row1
    assert on_one_clock([row0, row1], [100.0, 5000.0], ["a", "a"]) == row0 + row1


def test_action_overhead_reads_the_gaps_before_passes_whose_input_is_local() -> None:
    """A V on two ranks (rank 0: stages 0 and 3, rank 1: stages 1 and 2). The gaps before
    passes that wait for nothing but their own rank — stage 0's F, the turn F(2) after F(1)
    on rank 1, the last stage's I, a W — are 0.1, 0.2, 0.1, 0.3 and 0.1 ms: the overhead is
    their median, 0.1. The gaps before passes that wait for the other rank (7, 5 and 1 ms)
    do not count (with them: 0.25; counting any one of them, or missing the V's turn or the
    last stage's I, gives 0.15)."""
    acts = [
        ActionTiming(0, 0, "F", 0, 0.1, 1.0),  # the step's first pass: no gap before it
        ActionTiming(0, 0, "F", 1, 1.2, 2.0),  # 0.2
        ActionTiming(1, 1, "F", 0, 6.0, 7.0),  # waited for rank 0 (first on rank 1 anyway)
        ActionTiming(1, 2, "F", 0, 7.1, 8.0),  # 0.1: the V's turn, input on this rank
        ActionTiming(0, 3, "F", 0, 9.0, 10.0),  # 7.0: waited for rank 1's F(2)
        ActionTiming(0, 3, "I", 0, 10.1, 11.0),  # 0.1: the last stage's own loss
        ActionTiming(1, 1, "F", 1, 13.0, 14.0),  # 5.0: waited for rank 0's F(0, 1)
        ActionTiming(0, 3, "W", 0, 11.3, 12.0),  # 0.3
        ActionTiming(1, 2, "I", 0, 15.0, 16.0),  # 1.0: waited for rank 0's I(3)
        ActionTiming(1, 2, "W", 0, 16.1, 17.0),  # 0.1
    ]
    m = summarize([17.0, 17.0], acts, 2, None, None)
    assert nbt.action_overhead([m]) == pytest.approx(0.1)
    assert m.action_overhead() == pytest.approx(0.1)
    assert "0.100 ms between passes" in m.summary()


def test_replan_takes_the_measured_latency_and_drops_one_in_other_units() -> None:
    """replan(plan, cost, comm) plans with the measured latency (the same plan as asking the
    planner for it directly); without one, a comm given in unknown units is not kept beside
    costs in ms."""
    import nobubble
    from nobubble.torch.plans import make_plan, replan

    plan = make_plan("zb-h1", num_ranks=2, num_microbatches=4, comm=3.0)
    cost = [(1.0, 2.0, 1.0)] * 2
    assert "comm" not in replan(plan, cost).inputs
    again = replan(plan, cost, comm=0.5)
    assert again.inputs["comm"] == 0.5
    direct = nobubble.plan("zb-h1", 2, 4, cost=cost, comm=0.5, placement="auto")
    assert again.makespan == direct.makespan
    assert again.makespan > replan(plan, cost).makespan
    for bad in (-0.5, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="a finite number"):
            replan(plan, cost, overhead=bad)
        with pytest.raises(ValueError, match="a finite number"):
            replan(plan, cost, comm=bad)
    in_ms = dataclasses.replace(plan, inputs={**plan.inputs, "time_unit": "ms"})
    assert replan(in_ms, cost).inputs["comm"] == 3.0
    # The time between passes goes onto every pass, and is recorded.
    slower = replan(plan, cost, comm=0.5, overhead=0.25)
    assert slower.inputs["overhead"] == 0.25
    assert slower.inputs["cost"] == [(1.25, 2.25, 1.25)] * 2
    direct = nobubble.plan("zb-h1", 2, 4, cost=[(1.25, 2.25, 1.25)] * 2, comm=0.5)
    assert slower.makespan == direct.makespan


def test_ranks_agree_on_a_request_whatever_layout_their_stages_show() -> None:
    """The layout each rank reads off its own stages is not part of what ranks must agree
    on (with an odd rank count, the middle rank's looped stages look like a V's)."""
    from nobubble.torch.plans import _request_key

    a = _request_key("interleaved-1f1b", 6, {"placement": "v", "chunks": 2, "mem_limit": 2})
    b = _request_key("interleaved-1f1b", 6, {"placement": "auto", "chunks": 2, "mem_limit": 2})
    assert a == b
    assert a != _request_key("interleaved-1f1b", 6, {"placement": "auto", "mem_limit": 3})


def test_replan_keeps_a_single_memory_entry() -> None:
    """mem=(M_B, M_W) once for all stages survives a re-plan (it is not per chunk)."""
    from nobubble.torch.plans import make_plan, replan

    plan = make_plan("zb-h1", num_ranks=1, num_microbatches=4, mem=(1.0, 0.5))
    again = replan(plan, [(1.0, 2.0, 1.0)])
    assert again.inputs["mem"] == (1.0, 0.5)
    assert again.inputs["time_unit"] == "ms"


def test_a_lost_peer_says_the_other_ranks_error_is_the_cause(
    fake_rank1_of_2: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 cannot know why rank 0 stopped; its step failure says where to look. Other
    errors pass unchanged."""
    plan = nbt.plan_from_csv(V_CSV)
    stages = nbt.build_stages(gpt_chunks(CFG, 4), plan)
    schedule = nbt.PlannedSchedule(stages, 2, lm_loss, plan=plan)
    parent = type(schedule).__mro__[1]

    def gone(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:5")

    monkeypatch.setattr(parent, "step", gone)
    with pytest.raises(RuntimeError, match="closed by peer") as info:
        schedule.step(target=torch.zeros(4, CFG.seq_len, dtype=torch.long))
    assert any("another rank of this pipeline stopped" in n for n in info.value.__notes__)

    def other(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(parent, "step", other)
    with pytest.raises(RuntimeError, match="shape mismatch") as info:
        schedule.step(target=torch.zeros(4, CFG.seq_len, dtype=torch.long))
    assert not getattr(info.value, "__notes__", [])


def test_a_byte_budget_without_measured_memory_says_to_profile() -> None:
    """A limit in bytes needs the stages' activation bytes: the error says to profile, not to
    pass the CLI's mem= (make_plan's callers give costs=, not mem=)."""
    for limit in ("8GiB", ["8GiB", "6GiB"]):
        with pytest.raises(ValueError, match=r"pass costs=nobubble\.torch\.profile"):
            nbt.make_plan("zb-auto", num_ranks=2, num_microbatches=4, mem_limit=limit)
    # A multiple of M_B, or memory given directly, still plans.
    assert nbt.make_plan("zb-auto", num_ranks=2, num_microbatches=4, mem_limit="4").schedule
    plan = nbt.make_plan(
        "zb-auto", num_ranks=2, num_microbatches=4, mem=(1000, 400), mem_limit="8KB"
    )
    assert plan.schedule == "zb-auto"


def test_a_profile_of_one_chunk_per_rank_fits_a_v_plan_and_its_replan() -> None:
    """One profiled chunk per rank on a V plan of 2p stages: each chunk is shared out over
    the two stages it becomes, as the planner reads it, and a re-plan on measured per-stage
    times keeps the memory that way (it crashed at the re-plan step)."""
    import nobubble
    from nobubble.torch.plans import make_plan, replan

    prof = nbt.Profile(
        stages=(
            nbt.StageProfile(2.0, 4.0, 2.0, 100, 40, b=6.0),
            nbt.StageProfile(4.0, 8.0, 4.0, 200, 80),
        )
    )
    v = prof.fit(4)
    assert [s.f for s in v.stages] == [1.0, 1.0, 2.0, 2.0]
    assert [s.mem for s in v.stages] == [(50.0, 20.0)] * 2 + [(100.0, 40.0)] * 2
    assert v.stages[0].b == 3.0 and v.stages[2].b is None
    assert prof.fit(2) is prof
    assert prof.fit(1).stages[0].f == 6.0
    with pytest.raises(ValueError, match="multiple of the stage count"):
        prof.fit(3)
    assert prof.regroup(np.int64(1)).stages[0].f == 6.0
    # One chunk is one rank's share (as the planner reads one entry): 2 ranks × 2 stages.
    one = nbt.Profile(stages=(nbt.StageProfile(4.0, 4.0, 4.0, 800, 400),))
    assert [s.f for s in one.fit(4, 2).stages] == [2.0] * 4
    assert [s.mem_b for s in one.fit(4, 2).stages] == [400] * 4
    assert one.fit(4).stages[3].f == 4.0
    plan = make_plan("zb-auto", num_ranks=2, num_microbatches=4, costs=prof, placement="v")
    assert plan.num_stages == 4
    measured = [(1.0, 2.0, 1.0)] * 4
    again = replan(plan, measured)
    assert again.inputs["mem"] == [(50.0, 20.0), (50.0, 20.0), (100.0, 40.0), (100.0, 40.0)]
    direct = nobubble.plan("zb-auto", 2, 4, cost=measured, mem=again.inputs["mem"], placement="v")
    assert again.makespan == direct.makespan


def test_profile_does_not_charge_a_microbatch_for_the_batch_it_is_a_view_of() -> None:
    """A sample sliced from a large tensor counts as the microbatch, not the whole storage
    (the allocator does not count the caller's tensors on a GPU either)."""
    torch.manual_seed(0)
    chunks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2)]
    big_x, big_y = torch.randn(10_000, 16), torch.randn(10_000, 16)
    loss = torch.nn.functional.mse_loss
    view = nbt.profile(chunks, (big_x[:4], big_y[:4]), loss, warmup=0, iterations=1)
    own = nbt.profile(chunks, (big_x[:4].clone(), big_y[:4].clone()), loss, warmup=0, iterations=1)
    assert [s.mem for s in view.stages] == [s.mem for s in own.stages]
    # Each chunk holds a few 4 × 16 float tensors, far from the 640 KB of the storage.
    assert all(0 < s.mem_b < 4096 for s in view.stages)


def test_python_arguments_are_read_or_refused_not_truncated() -> None:
    from nobubble.torch.plans import agreed_plan

    assert nbt.FreeMemory(reserve="1GiB").reserve == 2**30
    assert nbt.FreeMemory(reserve="1.5 KB").reserve == 1500
    assert nbt.FreeMemory(reserve=np.int64(7)).reserve == 7
    with pytest.raises(ValueError, match="a size with a unit"):
        nbt.FreeMemory(reserve="lots")
    with pytest.raises(TypeError, match="reserve"):
        nbt.FreeMemory(reserve=float("nan"))
    with pytest.raises(TypeError, match="fraction"):
        nbt.FreeMemory(fraction="0.5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="num_ranks must be a whole number"):
        agreed_plan("1f1b", microbatches=4, num_ranks=2.7)
    assert agreed_plan("1f1b", microbatches=4, num_ranks=np.int64(2)).num_ranks == 2
    with pytest.raises(TypeError, match="decode bytes first"):
        nbt.plan_from_csv(b"0F0,0B0\n")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a finite size"):
        nbt.FreeMemory(reserve="1e400GiB")
    with pytest.raises(TypeError, match="iterations must be a whole number"):
        nbt.profile(gpt_chunks(CFG, 2), _example(2), lm_loss, iterations="3")  # type: ignore[arg-type]
    with torch.no_grad(), pytest.raises(RuntimeError, match="outside torch.no_grad"):
        nbt.profile(gpt_chunks(CFG, 2), _example(2), lm_loss, warmup=0, iterations=1)
