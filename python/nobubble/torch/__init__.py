"""nobubble plans, run by PyTorch's pipeline runtime (``torch.distributed.pipelining``).

Imported only when asked for (``import nobubble.torch``): nobubble itself does not need
PyTorch. From model chunks and a loss to training under a plan (every rank runs this;
``examples/torch_pipeline.py`` is the whole program)::

    import nobubble.torch as nbt

    chunks = [...]                                         # 2p nn.Modules, in order
    prof = nbt.profile(chunks, (x[:mb], y[:mb]), loss_fn)  # F/I/W ms, M_B/M_W bytes
    plan = nbt.agreed_plan("zb-auto", microbatches=8, costs=prof)  # rank 0 plans, all get it
    stages = nbt.build_stages(chunks, plan, device="cpu")  # PipelineStages of this rank
    schedule = nbt.PlannedSchedule(stages, 8, loss_fn, plan=plan, measure=True)
    opt = torch.optim.AdamW([p for s in stages for p in s.submod.parameters()])
    for x, y in batches:
        opt.zero_grad()
        schedule.step(x, target=y)      # pass x on the first stage's rank, y on the last's
        opt.step()
    print(schedule.measurements[-1].summary())             # measured vs planned

With 2p chunks, ``agreed_plan`` plans the linear layout (neighbouring chunks paired) and the
V layout (one chunk per stage) and keeps the faster; ``build_stages`` cuts the same chunks
the same way. ``PlannedSchedule(stages, 8, loss_fn, schedule="zb-auto", costs=prof)``
plans on the spot instead, for the placement of the stages given (a collective). To let
the planner choose the cut as well, profile the layers ``[embedding, *blocks, head]``
and pass ``layers=prof`` to ``agreed_plan``; ``build_stages(layers, plan)`` then cuts by
``plan.layer_split``. With a large vocabulary pass ``return_outputs=False`` to ``step``:
merging every microbatch's logits is a large copy a training loop does not need.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as _error:  # nobubble itself needs no torch; this subpackage does
    raise ImportError(
        "nobubble.torch drives PyTorch's pipeline runtime and needs PyTorch: "
        "pip install torch (or pip install './python[torch]')"
    ) from _error

from nobubble.torch._compat import TESTED_TORCH
from nobubble.torch.free_memory import FreeMemory
from nobubble.torch.memory import ActivationMemoryTracker, format_bytes
from nobubble.torch.plans import (
    PlanLike,
    PlanSnapshot,
    agreed_plan,
    check_same_plan,
    make_plan,
    plan_from_csv,
    replan,
)
from nobubble.torch.profiling import Profile, StageProfile, profile
from nobubble.torch.schedule import PlannedSchedule
from nobubble.torch.stages import build_stages, cut_by_layer_split, split_layers, stage_modules
from nobubble.torch.timing import (
    ActionTiming,
    StepMeasurement,
    action_overhead,
    chrome_trace,
    message_latency,
    pass_times,
    write_trace,
)

__all__ = [
    "TESTED_TORCH",
    "ActionTiming",
    "ActivationMemoryTracker",
    "FreeMemory",
    "PlanLike",
    "PlanSnapshot",
    "PlannedSchedule",
    "Profile",
    "StageProfile",
    "StepMeasurement",
    "action_overhead",
    "agreed_plan",
    "build_stages",
    "check_same_plan",
    "chrome_trace",
    "cut_by_layer_split",
    "format_bytes",
    "make_plan",
    "message_latency",
    "pass_times",
    "plan_from_csv",
    "profile",
    "replan",
    "split_layers",
    "stage_modules",
    "write_trace",
]
