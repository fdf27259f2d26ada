"""The one place where nobubble.torch touches PyTorch's private pipelining API.

PyTorch's public API has no way to hand a schedule an arbitrary per-rank list of F/I/W
actions, nor to run one chunk's input-gradient and weight-gradient passes separately
outside a schedule. Both exist in private modules of ``torch.distributed.pipelining``:

- ``schedules._PipelineScheduleRuntime``: the runtime behind ``ScheduleZBVZeroBubble`` and
  ``ScheduleInterleavedZeroBubble``; it lowers a compute-only action list (the format of
  PyTorch's schedule CSV) to one with sends and receives and executes it;
- ``schedules._Action``: one parsed action (``"1I3"``);
- ``_backward.stage_backward_input`` / ``stage_backward_weight`` / ``stage_backward``: the
  functions ``PipelineStage`` uses for I, W and full B.

Everything private is imported here and nowhere else, so that a PyTorch release that moves
them fails at import with one message naming the version, not deep inside a training step.
"""

from __future__ import annotations

from typing import Any

import torch

TESTED_TORCH = "2.15"


def _missing(what: str, error: Exception) -> ImportError:
    return ImportError(
        f"nobubble.torch needs {what} from torch.distributed.pipelining, which this PyTorch "
        f"({torch.__version__}) does not provide ({error}). nobubble.torch was written against "
        f"PyTorch {TESTED_TORCH}; install that version (pip install 'torch=={TESTED_TORCH}.*') "
        "or report the PyTorch version you need at the nobubble issue tracker."
    )


try:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        _Action,
        _ComputationType,
        _PipelineScheduleRuntime,
    )
    from torch.distributed.pipelining.stage import _PipelineStageBase
except ImportError as exc:  # pragma: no cover - depends on the installed torch
    raise _missing("_PipelineScheduleRuntime, _Action and PipelineStage", exc) from exc

try:
    from torch.distributed.pipelining._backward import (
        stage_backward,
        stage_backward_input,
        stage_backward_weight,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed torch
    raise _missing("stage_backward_input/stage_backward_weight", exc) from exc

_RUNTIME_HOOKS = ("_prepare_schedule_with_comms", "_step_microbatches")
for _name in _RUNTIME_HOOKS:
    if not hasattr(_PipelineScheduleRuntime, _name):  # pragma: no cover
        raise _missing(f"_PipelineScheduleRuntime.{_name}", AttributeError(_name))

for _name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
    if not hasattr(_PipelineStageBase, _name):  # pragma: no cover
        raise _missing(f"PipelineStage.{_name}", AttributeError(_name))

FORWARD = _ComputationType.FORWARD
BACKWARD_INPUT = _ComputationType.BACKWARD_INPUT
BACKWARD_WEIGHT = _ComputationType.BACKWARD_WEIGHT
FULL_BACKWARD = _ComputationType.FULL_BACKWARD
COMPUTE_TYPES = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)


def parse_action(text: str) -> Any:
    """Parses one compute action (``"3I1"``) with PyTorch's own parser.

    Raises ValueError naming the cell when it is not a compute action with a microbatch.
    """
    try:
        action = _Action.from_str(text)
    except RuntimeError as exc:
        raise ValueError(
            f"plan action {text!r} is not a PyTorch action string; expected "
            "{stage}{F|I|W|B}{microbatch}, e.g. '0F3' or '1W2'"
        ) from exc
    if action is None or action.computation_type not in COMPUTE_TYPES:
        raise ValueError(
            f"plan action {text!r} is not a compute action (F, I, W or B); a plan lists "
            "compute only, PyTorch adds the sends and receives"
        )
    if action.microbatch_index is None:
        raise ValueError(f"plan action {text!r} has no microbatch number, e.g. '0F3'")
    return action


__all__ = [
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "COMPUTE_TYPES",
    "FORWARD",
    "FULL_BACKWARD",
    "PipelineStage",
    "_PipelineScheduleRuntime",
    "_PipelineStageBase",
    "parse_action",
    "stage_backward",
    "stage_backward_input",
    "stage_backward_weight",
]
