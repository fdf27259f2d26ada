"""The Python planner is the CLI's planner: same schedules, same errors, same simulator."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import nobubble

REPO = Path(__file__).resolve().parents[2]


def cli_binary() -> Path:
    """The `nobubble` binary to compare against (NOBUBBLE_BIN, else the workspace's build)."""
    if "NOBUBBLE_BIN" in os.environ:
        return Path(os.environ["NOBUBBLE_BIN"])
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "nobubble"
        if path.exists():
            return path
    pytest.fail("no nobubble binary: run `cargo build` first, or set NOBUBBLE_BIN")


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [str(cli_binary()), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert (run.returncode == 0) == ok, (args, run.stdout, run.stderr)
    return run


# Every family, with a pipeline it applies to (interleaved ones need m a multiple of p).
FAMILIES = [name for name, _ in nobubble.schedules()]
COSTS = [(1.0, 1.2, 0.8), (2.0, 1.0, 1.0), (1.0, 2.0, 0.5), (1.5, 1.5, 1.0)]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_plans_the_clis_schedule(name: str) -> None:
    p, m = 4, 8
    py = nobubble.plan(name, 4, 8, cost=COSTS, comm=0.05, mem=(1.0, 0.4))
    costs = {
        "comm": 0.05,
        "stages": [dict(f=f, i=i, w=w, mem_b=1.0, mem_w=0.4) for f, i, w in COSTS],
    }
    path = REPO / "target" / f"py-costs-{name}.json"
    path.write_text(json.dumps(costs))
    try:
        out = cli("plan", "-s", name, "-p", str(p), "-m", str(m), "--costs", str(path), "-f", "csv")
    finally:
        path.unlink()
    assert py.to_csv() == out.stdout
    assert py.num_ranks == p and py.num_microbatches == m
    assert sorted(s for r in range(p) for s in py.stages_of(r)) == list(range(py.num_stages))


@pytest.mark.parametrize(
    ("limit", "flag"),
    [
        (6, "6"),
        ("6000B", "6000B"),
        ("6kb", "6000B"),  # units in any case
        (["8KB", "8KB", "8KB", "2KB"], "8KB,8KB,8KB,2KB"),
    ],
)
def test_memory_limits_plan_as_on_the_command_line(limit: object, flag: str) -> None:
    py = nobubble.plan("zb-auto", 4, 8, mem=(1000.0, 400.0), mem_limit=limit)
    out = cli(
        "plan",
        "-s",
        "zb-auto",
        "-p",
        "4",
        "-m",
        "8",
        "--mem",
        "1000,400",
        "--mem-limit",
        flag,
        "-f",
        "json",
    )
    report = json.loads(out.stdout)
    assert py.makespan == report["makespan"]
    assert py.actions == report["actions"]
    # The limit holds rank by rank.
    budgets = [6000.0] * 4 if flag in ("6", "6000B") else [8000.0, 8000.0, 8000.0, 2000.0]
    assert all(peak <= b + 1e-9 for peak, b in zip(py.peak_memory, budgets))


def test_a_v_plan_says_which_stages_each_rank_builds() -> None:
    plan = nobubble.plan("zb-v", 4, 8)
    assert plan.placement_kind == "v"
    assert plan.num_stages == 8
    assert [plan.stages_of(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert all(plan.rank_of(s) == r for r in range(4) for s in plan.stages_of(r))
    assert all(a[0] in "0123456789" for row in plan.actions for a in row)
    with pytest.raises(IndexError, match="ranks are 0 to 3"):
        plan.stages_of(4)


def test_bounds_exports_and_the_simulator_agree_with_the_plan() -> None:
    plan = nobubble.plan("zb-auto", 4, 12, cost=(1.0, 1.2, 0.8), objective="makespan")
    assert plan.objective == "makespan"
    assert 0 < plan.lower_bound <= plan.makespan + 1e-9
    assert 0 <= plan.bubble_rate < 0.2
    again = nobubble.simulate(plan.actions, cost=(1.0, 1.2, 0.8))
    assert again.makespan == plan.makespan and again.to_csv() == plan.to_csv()
    trace = json.loads(plan.to_chrome_trace())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 3 * plan.num_stages * 12
    svg = plan.to_svg()
    assert svg.startswith("<svg") and svg.count("<title>") == 3 * plan.num_stages * 12
    assert "zb-auto" in repr(plan)


def test_a_notebook_draws_a_plan_and_leaves_a_large_one_as_text() -> None:
    small = nobubble.plan("zb-h1", 4, 8)
    assert small._repr_svg_() == small.to_svg()
    # 3 passes × 32 stages × 64 microbatches = 6144 actions: past the inline limit (4096).
    large = nobubble.plan("zb-h1", 32, 64)
    assert large._repr_svg_() is None
    assert large.to_svg().startswith("<svg")


def test_pytorch_class_names_are_schedule_names() -> None:
    a = nobubble.plan("ScheduleZBVZeroBubble", 2, 4)
    b = nobubble.plan("zb-v", 2, 4)
    assert a.to_csv() == b.to_csv()


def test_a_planner_error_survives_pickling() -> None:
    """torch.distributed's object collectives pickle rank 0's planner error for every rank."""
    import pickle

    error = error_of(lambda: nobubble.plan("1f1b", stages=0, microbatches=4))
    again = pickle.loads(pickle.dumps(nobubble.ScheduleError(error)))
    assert type(again) is nobubble.ScheduleError and str(again) == error


def error_of(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, nobubble.ScheduleError)
    return str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "flags"),
    [
        (dict(schedule="1f1b", stages=0, microbatches=4), ["-s", "1f1b", "-p", "0", "-m", "4"]),
        (dict(schedule="1f1b", stages=2, microbatches=0), ["-s", "1f1b", "-p", "2", "-m", "0"]),
        (
            dict(schedule="LoopedBFS", stages=2, microbatches=4),
            ["-s", "LoopedBFS", "-p", "2", "-m", "4"],
        ),
        (
            dict(
                schedule="zb-auto", stages=4, microbatches=8, mem=(1000.0, 400.0), mem_limit="0.5KB"
            ),
            ["-s", "zb-auto", "-p", "4", "-m", "8", "--mem", "1000,400", "--mem-limit", "0.5KB"],
        ),
        (
            dict(
                schedule="zb-auto",
                stages=4,
                microbatches=8,
                mem=(1000.0, 400.0),
                mem_limit=["8KB", "8KB"],
            ),
            ["-s", "zb-auto", "-p", "4", "-m", "8", "--mem", "1000,400", "--mem-limit", "8KB,8KB"],
        ),
        (
            dict(schedule="zb-h2", stages=2, microbatches=4, placement="v"),
            ["-s", "zb-h2", "-p", "2", "-m", "4", "--placement", "v"],
        ),
        (
            dict(schedule="zb-h2", stages=3, microbatches=6, mem_limit=2),
            ["-s", "zb-h2", "-p", "3", "-m", "6", "--mem-limit", "2"],
        ),
    ],
)
def test_invalid_input_raises_the_clis_message(kwargs: dict, flags: list[str]) -> None:
    ours = error_of(lambda: nobubble.plan(**kwargs))
    theirs = cli("plan", *flags, ok=False).stderr.strip()
    # The CLI names a setting by its flag (--mem-limit), Python by its keyword (mem_limit).
    for keyword in ("stages", "microbatches", "mem_limit", "placement"):
        ours = ours.replace(f"{keyword}: ", f"--{keyword.replace('_', '-')}: ")
    assert ours in theirs, (ours, theirs)


def test_check_names_the_rank_and_action_at_fault() -> None:
    bad = "0F0,0B0\n1B0,1F0\n"
    ours = error_of(lambda: nobubble.check(bad))
    path = REPO / "target" / "py-bad.csv"
    path.write_text(bad)
    try:
        theirs = cli("check", str(path), ok=False).stderr
    finally:
        path.unlink()
    assert "rank" in ours and ours in theirs, (ours, theirs)
    good = nobubble.plan("1f1b", 2, 2).to_csv()
    assert nobubble.check(good).makespan == nobubble.plan("1f1b", 2, 2).makespan


def test_bad_argument_types_say_what_to_give() -> None:
    with pytest.raises(TypeError, match=r"\(F, I, W\)"):
        nobubble.plan("zb-h1", 2, 4, cost=(1.0, 2.0))
    with pytest.raises(ValueError, match="sizes with units"):
        nobubble.plan("zb-auto", 2, 4, mem_limit=[1000, 2000])
    with pytest.raises(ValueError, match="multiple of M_B"):
        nobubble.plan("zb-auto", 2, 4, mem_limit=268435456)
    # A size against the unitless default memory would be no limit at all.
    with pytest.raises(ValueError, match="needs mem= in bytes"):
        nobubble.plan("zb-auto", 2, 4, mem_limit="20MiB")
    with pytest.raises(ValueError, match="time `f` must be a positive number"):
        nobubble.plan("zb-auto", 2, 4, cost=(-1.0, 1.0, 1.0))


def test_model_chunks_price_every_layout() -> None:
    """Costs of 2p model chunks: a linear plan sums neighbouring chunks, a V plan takes them
    one per stage, and zb-auto compares the two layouts on the same model."""
    chunks = [(1.0, 1.0, 1.0), (2.0, 2.0, 2.0), (3.0, 3.0, 3.0), (4.0, 4.0, 4.0)]
    linear = nobubble.plan("1f1b", 2, 4, cost=chunks)
    assert linear.stage_costs == [(3.0, 3.0, 3.0), (7.0, 7.0, 7.0)]
    v = nobubble.plan("zb-v", 2, 4, cost=chunks)
    assert v.stage_costs == chunks
    best = nobubble.plan("zb-auto", 2, 8, cost=chunks)
    for placement in ("linear", "v"):
        other = nobubble.plan("zb-auto", 2, 8, cost=chunks, placement=placement)
        assert max(best.span) <= max(other.span) + 1e-9
    with pytest.raises(ValueError, match="a multiple of 2"):
        nobubble.plan("1f1b", 2, 4, cost=chunks[:3])


def test_counts_and_indices_name_the_argument() -> None:
    """Negative, boolean or out-of-range numbers are refused naming the argument, and an
    index error gives the valid range as Python users read it."""
    with pytest.raises(ValueError, match=r"^stages: must be at least 1, got -2$"):
        nobubble.plan("zb-h1", stages=-2, microbatches=4)
    with pytest.raises(ValueError, match=r"^microbatches: must be at least 1, got -1$"):
        nobubble.plan("zb-h1", stages=2, microbatches=-1)
    with pytest.raises(TypeError, match="stages takes a whole number, got a bool"):
        nobubble.plan("zb-h1", stages=True, microbatches=4)
    with pytest.raises(TypeError, match="not a bool"):
        nobubble.plan("zb-h1", stages=2, microbatches=4, mem_limit=True)
    with pytest.raises(ValueError, match="per-rank list is empty"):
        nobubble.plan("zb-h1", stages=2, microbatches=4, mem_limit=[])
    plan = nobubble.plan("zb-h1", stages=2, microbatches=4)
    with pytest.raises(IndexError, match=r"rank 5 is out of range: the plan's ranks are 0 to 1"):
        plan.stages_of(5)
    with pytest.raises(IndexError, match=r"stage -1 is out of range: the plan's stages are 0 to 1"):
        plan.rank_of(-1)


def test_chunks_and_placement_are_never_ignored() -> None:
    """chunks= only for the schedules that choose it; a placement matching a schedule's own
    layout is accepted (a caller that built its stages passes it along), another refused."""
    assert nobubble.plan("interleaved-1f1b", 2, 4, chunks=3).num_stages == 6
    assert nobubble.plan("zb-v", 2, 4, chunks=2).num_stages == 4
    with pytest.raises(ValueError, match=r"chunks: zb-v has 2 stage\(s\) per rank, not 3"):
        nobubble.plan("zb-v", 2, 4, chunks=3)
    with pytest.raises(ValueError, match=r"chunks: zb-h1 has 1 stage\(s\) per rank, not 3"):
        nobubble.plan("zb-h1", 2, 4, chunks=3)
    same = nobubble.plan("zb-h1", 2, 4, placement="linear")
    assert same.actions == nobubble.plan("zb-h1", 2, 4).actions
    assert nobubble.plan("zb-v", 2, 4, placement="v").num_stages == 4
    # One rank's two looped chunks are a V as well.
    assert nobubble.plan("interleaved-1f1b", 1, 2, placement="v").num_stages == 2
    with pytest.raises(ValueError, match="placement: zb-v places two stages per rank"):
        nobubble.plan("zb-v", 2, 4, placement="linear")
    with pytest.raises(ValueError, match="placement: interleaved-1f1b places its chunks looped"):
        nobubble.plan("interleaved-1f1b", 2, 4, placement="v")
    with pytest.raises(ValueError, match="^microbatches: must be a multiple of the 4 ranks"):
        nobubble.plan("interleaved-1f1b", stages=4, microbatches=3)


def test_a_file_name_where_text_belongs_says_to_read_it(tmp_path: Path) -> None:
    path = tmp_path / "theirs.csv"
    path.write_text(nobubble.plan("1f1b", 2, 2).to_csv())
    with pytest.raises(ValueError, match=r"check takes the schedule CSV text, not a file name"):
        nobubble.check(str(path))
    with pytest.raises(ValueError, match=r"pass open\(\"costs.json\"\).read\(\)"):
        nobubble.plan("zb-auto", 2, 4, layer_costs="costs.json")


def test_simulate_says_what_shape_it_takes() -> None:
    with pytest.raises(TypeError, match="one list of actions per rank"):
        nobubble.simulate("0F0")
    with pytest.raises(ValueError, match="the action list is empty"):
        nobubble.simulate([])
    with pytest.raises(ValueError, match="rank 1 has no actions"):
        nobubble.simulate([["0F0", "0I0", "0W0"], []])
    assert nobubble.simulate([["0F0", "0I0", "0W0"]]).num_ranks == 1


def test_every_other_name_listed_plans_its_schedule() -> None:
    names = dict(nobubble.schedule_names())
    assert [n for n, _ in nobubble.schedules()] == list(names)
    assert "ScheduleZBVZeroBubble" in names["zb-v"]
    assert "Schedule1F1B" in names["1f1b"]
    for name, others in names.items():
        want = nobubble.plan(name, 2, 4).actions
        for other in others:
            assert nobubble.plan(other, 2, 4).actions == want, (name, other)


def test_zb_auto_takes_chunks_as_its_placement() -> None:
    """zb-auto plans either layout: chunks=1 (one stage built per rank) is the linear plan,
    chunks=2 the V one; a placement saying otherwise is refused, never ignored."""
    linear = nobubble.plan("zb-auto", 4, 8, chunks=1)
    assert linear.num_stages == 4 and linear.placement_kind == "linear"
    assert linear.actions == nobubble.plan("zb-auto", 4, 8, placement="linear").actions
    v = nobubble.plan("zb-auto", 4, 8, chunks=2)
    assert v.num_stages == 8 and v.placement_kind == "v"
    with pytest.raises(ValueError, match='chunks=1 means the linear placement but placement="v"'):
        nobubble.plan("zb-auto", 4, 8, chunks=1, placement="v")
    with pytest.raises(ValueError, match='chunks=2 means the v placement but placement="linear"'):
        nobubble.plan("zb-auto", 4, 8, chunks=2, placement="linear")
    with pytest.raises(ValueError, match="zb-auto plans 1 stage per rank"):
        nobubble.plan("zb-auto", 4, 8, chunks=3)


def test_the_limit_a_plan_was_made_under_is_shown() -> None:
    """mem_limit is the request; limit the multiple the plan was made under, a default
    included (as the CLI prints it)."""
    default = nobubble.plan("zb-auto", 4, 8)
    assert default.mem_limit == "none" and default.limit == 8.0
    out = json.loads(cli("plan", "-s", "zb-auto", "-p", "4", "-m", "8", "-f", "json").stdout)
    assert out["mem_limit"] == default.limit
    assert nobubble.plan("zb-auto", 4, 8, mem_limit=3).limit == 3.0
    assert nobubble.plan("1f1b", 4, 8).limit is None


def test_layer_costs_refuse_per_stage_costs_beside_them() -> None:
    """layer_costs carries its own times, memory and comm: the others would be ignored."""
    layers = (REPO / "docs/examples/layers-8b-vocab128k.json").read_text()
    for extra in ({"cost": (1, 1, 1)}, {"mem": (5, 6)}, {"comm": 0.0}):
        with pytest.raises(ValueError, match=f"leave out {next(iter(extra))}"):
            nobubble.plan("zb-auto", 4, 8, layer_costs=layers, **extra)


def test_plans_compare_pickle_and_copy() -> None:
    import copy
    import pickle

    layers = (REPO / "docs/examples/layers-8b-vocab128k.json").read_text()
    plans = [
        nobubble.plan("zb-auto", 4, 8, cost=[(1, 1.2, 0.8)] * 4, mem=(1, 0.4), mem_limit=3),
        nobubble.plan("zb-v", 4, 8, comm=0.5),
        nobubble.plan("zb-auto", 4, 8, mem=(1000, 400), mem_limit="3000B"),
        nobubble.plan("zb-auto", 4, 8, layer_costs=layers, mem_limit=4),
        nobubble.simulate([["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]]),
    ]
    for p in plans:
        for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
            assert q == p and hash(q) == hash(p)
            for attr in ("actions", "makespan", "bubble_rate", "peak_memory", "lower_bound"):
                assert getattr(q, attr) == getattr(p, attr), attr
            for attr in ("span_lower_bound", "mem_limit", "limit", "layer_split", "objective"):
                assert getattr(q, attr) == getattr(p, attr), attr
            assert q.to_svg() == p.to_svg()
    assert plans[0] != plans[1] and plans[0] != "a plan"
    assert nobubble.plan("zb-v", 4, 8) == nobubble.plan("zb-v", 4, 8)
    assert nobubble.plan("zb-v", 4, 8) != nobubble.plan("zb-v", 4, 8, comm=0.5)


def test_pictures_tell_every_chunk_apart_and_stay_valid_xml() -> None:
    import xml.etree.ElementTree as ET

    svg = nobubble.plan("interleaved-1f1b", 4, 8, chunks=3).to_svg()
    ET.fromstring(svg)
    fills = {}
    for rect in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}rect"):
        title = rect.find("{http://www.w3.org/2000/svg}title")
        action = title.text.split(":")[0] if title is not None and title.text else ""
        if action.endswith("F0"):
            fills[action] = rect.get("fill")
    # Stages 0, 4 and 8 are rank 0's three chunks.
    assert len({fills.get("0F0"), fills.get("4F0"), fills.get("8F0")}) == 3, fills
    weird = nobubble.simulate([["0F0", "0B0"]], name="bad\x00name\x07<&>")
    ET.fromstring(weird.to_svg())


def test_wrong_types_name_the_argument() -> None:
    plan = nobubble.plan("1f1b", 4, 8)
    for call, message in [
        (lambda: nobubble.plan(1, 4, 8), "schedule takes a schedule name"),
        (lambda: nobubble.plan("1f1b", 4, 8, comm="1"), "comm takes a number, got str"),
        (lambda: nobubble.plan("1f1b", 4, 8, comm=True), "comm takes a number, got bool"),
        (lambda: nobubble.plan("1f1b", 4, 8, placement=3), "placement takes"),
        (lambda: nobubble.plan("1f1b", 4, 8, objective=1), "objective takes"),
        (lambda: nobubble.check(b"0F0,0B0"), "check takes the schedule CSV as a str"),
        (lambda: nobubble.check([["0F0"]]), "use nobubble.simulate"),
        (lambda: nobubble.simulate([["0F0", "0B0"]], name=1), "name takes a string"),
        (lambda: plan.stages_of(True), "rank takes a whole number, got bool"),
        (lambda: plan.rank_of(1.0), "stage takes a whole number, got float"),
    ]:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(IndexError, match="rank 1180591620717411303424 is out of range"):
        plan.stages_of(2**70)
    with pytest.raises(ValueError, match="stages: 1000000000000000000000000000000 is too large"):
        nobubble.plan("1f1b", 10**30, 8)
    # None is the default; numpy's integers are whole numbers.
    assert (
        nobubble.plan("zb-auto", 4, 8, placement=None).actions
        == nobubble.plan("zb-auto", 4, 8).actions
    )
    np = pytest.importorskip("numpy")
    assert plan.stages_of(np.int64(2)) == [2]


def test_timeline_and_summary_figures_are_the_clis() -> None:
    py = nobubble.plan("zb-auto", 4, 8, cost=(1.0, 1.2, 0.8), comm=0.05, mem_limit=3)
    out = cli(
        "plan",
        "-s",
        "zb-auto",
        "-p",
        "4",
        "-m",
        "8",
        "--cost",
        "1,1.2,0.8",
        "--comm",
        "0.05",
        "--mem-limit",
        "3",
        "-f",
        "json",
    )
    want = json.loads(out.stdout)
    assert py.busy == want["busy"] and py.idle == want["idle"]
    assert py.messages == want["messages"] and py.critical_path == want["critical_path"]
    assert py.timeline == [
        [(e["action"], e["start"], e["end"]) for e in rank] for rank in want["timeline"]
    ]
    # And with each other: the timeline holds every action in program order, its passes add
    # up to the busy time, and the critical path ends on the last action to finish.
    assert [[a for a, _, _ in rank] for rank in py.timeline] == py.actions
    for rank, busy, idle, span in zip(py.timeline, py.busy, py.idle, py.span):
        assert sum(end - start for _, start, end in rank) == pytest.approx(busy)
        assert idle == pytest.approx(span - busy)
    last = max((end, a) for rank in py.timeline for a, _, end in rank)
    assert last[0] == py.makespan and py.critical_path[-1] == last[1]
    assert py.messages > 0


def test_ctrl_c_interrupts_a_long_plan() -> None:
    import signal
    import threading
    import time

    # p = m = 700 plans in about 3 s on a 2-core VM (a release build); Ctrl-C at 0.3 s.
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        nobubble.plan("zb-auto", 700, 700)
    elapsed = time.monotonic() - start
    timer.cancel()
    assert elapsed < 1.5, f"KeyboardInterrupt came after {elapsed:.2f} s"
    # The module plans on afterwards.
    assert nobubble.plan("1f1b", 2, 4).makespan > 0


def test_a_fourth_cost_is_the_fused_backward() -> None:
    """``cost=(F, I, W, B)`` charges fused backward passes B (1F1B's makespan follows it), the
    plan reports B among its stage costs so that a re-plan can pass them back, and a fourth
    ``None`` means B = I + W, as three numbers do."""
    fused = nobubble.plan("1f1b", 4, 8, cost=(1.0, 1.0, 1.0, 1.2))
    assert fused.makespan == pytest.approx(11 * 2.2)
    assert fused.stage_costs == [(1.0, 1.0, 1.0, 1.2)] * 4
    again = nobubble.plan("zb-auto", 4, 8, cost=fused.stage_costs)
    assert again.makespan == nobubble.plan("zb-auto", 4, 8, cost=(1.0, 1.0, 1.0, 1.2)).makespan
    split = nobubble.plan("1f1b", 4, 8, cost=(1.0, 1.0, 1.0, None))
    assert split.makespan == nobubble.plan("1f1b", 4, 8, cost=(1.0, 1.0, 1.0)).makespan == 33.0
    assert split.stage_costs == [(1.0, 1.0, 1.0)] * 4
    with pytest.raises(TypeError, match=r"cost takes 3 or 4 numbers"):
        nobubble.plan("1f1b", 4, 8, cost=(1.0, None, 1.0))


def test_measured_svg_draws_a_measured_timeline_above_the_plan() -> None:
    """Every measured action and every planned one gets a titled box; the header compares
    the measured span with the plan's makespan; bad rows are refused with what to give."""
    plan = nobubble.plan("1f1b", 2, 2, cost=(1.0, 1.0, 1.0))
    measured = [[(a, start * 1.5, end * 1.5) for a, start, end in row] for row in plan.timeline]
    span = max(end for row in measured for _, _, end in row)
    svg = plan.measured_svg(measured, title="a run", plan_title="the plan")
    assert svg.startswith("<svg") and svg.count("<title>") == 2 * 8
    assert f"measured span {span:.2f} · plan's makespan {plan.makespan:.2f} (+50.0%)" in svg
    assert "a run" in svg and "the plan" in svg
    with pytest.raises(ValueError, match="measured has 1 ranks and the plan 2"):
        plan.measured_svg(measured[:1])
    with pytest.raises(ValueError, match="cannot read action `X1`"):
        plan.measured_svg([[("X1", 0.0, 1.0)], []])
    for start, end in ((2.0, 1.0), (-5.0, -1.0)):
        with pytest.raises(ValueError, match="0 ≤ start ≤ end"):
            plan.measured_svg([[("0F0", start, end)], []])
    # Actions the plan does not give that rank: another rank's stage, a stage past the
    # plan's (no panic), a microbatch past its count, an action twice.
    for row in ([("1F0", 0, 1)], [("5F0", 0, 1)], [("0F7", 0, 1)], [("0F0", 0, 1)] * 2):
        with pytest.raises(ValueError, match="not one of that rank's actions"):
            plan.measured_svg([row, []])
    with pytest.raises(TypeError, match="one list per rank"):
        plan.measured_svg("0F0")


def test_a_damaged_pickled_plan_is_a_clear_error_not_a_panic_or_an_abort() -> None:
    """A plan's state from another version, or edited, is checked before it is simulated
    (what pickle.loads calls, given the edited state)."""
    import pickle

    plan = nobubble.plan("1f1b", stages=2, microbatches=2)
    rebuild, (state,) = plan.__reduce__()
    assert pickle.loads(pickle.dumps(plan)) == plan == rebuild(state)
    assert '"microbatch":0,"stage":0' in state and '"microbatches":2' in state
    for old, new in [
        ('"microbatch":0,"stage":0', '"microbatch":7,"stage":0'),
        ('"microbatches":2', '"microbatches":100000000'),
        ('"microbatches":2', '"microbatches":18446744073709551615'),
        ('"f":1.0', '"f":-1.0'),
    ]:
        damaged = state.replace(old, new, 1)
        assert damaged != state
        with pytest.raises(ValueError, match="not the state of a nobubble.Plan"):
            rebuild(damaged)


def test_numpy_arrays_and_tensors_are_costs_like_lists() -> None:
    np = pytest.importorskip("numpy")
    rows = [[1.0, 2.0, 1.0], [2.0, 2.0, 1.0]]
    want = nobubble.plan("zb-h1", 2, 4, cost=rows, mem=[[1.0, 0.5]] * 2)
    got = nobubble.plan("zb-h1", 2, 4, cost=np.array(rows), mem=np.array([[1.0, 0.5]] * 2))
    assert got.makespan == want.makespan
