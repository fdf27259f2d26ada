"""The example runs as documented: ``torchrun --nproc-per-node 2 examples/torch_pipeline.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
nobubble = pytest.importorskip("nobubble")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch_pipeline.py"
TIMEOUT_S = 180


def test_example_trains_and_writes_a_trace(tmp_path: Path) -> None:
    """Two CPU ranks: the loss falls, measured and planned step times are printed, and the
    trace is valid Perfetto JSON. ``--standalone`` lets torchrun pick a free port; on a
    timeout the whole process group this test started (torchrun and its workers) is killed.
    """
    trace = tmp_path / "trace.json"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    args += ["--nproc-per-node", "2", str(EXAMPLE), "--steps", "4", "--trace", str(trace)]
    args += ["--hidden", "64", "--seq-len", "32"]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()},
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the example did not finish in {TIMEOUT_S} s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    losses = [
        float(line.split("loss ")[1].split()[0])
        for line in out.splitlines()
        if line.startswith("step ") and "loss " in line
    ]
    assert len(losses) == 4, out
    assert losses[-1] < losses[0], out
    assert "planned" in out and "re-planned on the measured pass times" in out, out
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}


def _pythonpath() -> str:
    """The workers import the nobubble these tests import (the source tree's, when run there)."""
    here = str(Path(nobubble.__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH")
    return here if not rest else here + os.pathsep + rest
