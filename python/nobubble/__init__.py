"""nobubble: zero-bubble pipeline-parallel schedules.

The planner is nobubble's Rust library, the same one the ``nobubble`` command line runs:
:func:`plan` gives bit for bit the schedule ``nobubble plan`` prints. :mod:`nobubble.torch`
(imported on its own, needs PyTorch) trains a model under a plan with PyTorch's pipeline
runtime.

    >>> import nobubble
    >>> p = nobubble.plan("zb-h1", stages=2, microbatches=4)
    >>> p.actions[1][:3]
    ['1F0', '1I0', '1F1']
"""

from __future__ import annotations

from nobubble._native import (
    Plan,
    ScheduleError,
    __version__,
    check,
    plan,
    schedule_names,
    schedules,
    simulate,
)

__all__ = [
    "Plan",
    "ScheduleError",
    "__version__",
    "check",
    "plan",
    "schedule_names",
    "schedules",
    "simulate",
]
