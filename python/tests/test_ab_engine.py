"""`python/bench/ab_engine.py`: its argument handling, and one real alternating comparison."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "python" / "bench" / "ab_engine.py"


def load():
    spec = importlib.util.spec_from_file_location("ab_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_given_flags_replace_the_defaults_and_the_rest_stay():
    ab = load()
    defaults = ["--hidden", "256", "--repeat", "5"]
    assert ab.with_overrides(defaults, []) == defaults
    assert ab.with_overrides(defaults, ["--repeat", "2"]) == ["--hidden", "256", "--repeat", "2"]
    assert ab.with_overrides(defaults, ["--repeat=2", "--simd", "avx2"]) == [
        "--hidden",
        "256",
        "--repeat=2",
        "--simd",
        "avx2",
    ]


def test_one_binary_is_refused_with_what_to_give():
    done = subprocess.run([sys.executable, str(SCRIPT), "nobubble"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "at least two binaries" in done.stderr


@pytest.mark.skipif(not os.environ.get("NOBUBBLE_BIN"), reason="needs NOBUBBLE_BIN")
def test_a_binary_against_itself_gives_ratios_for_every_pass():
    binary = os.environ["NOBUBBLE_BIN"]
    tiny = ["--hidden", "32", "--heads", "2", "--seq-len", "16", "--microbatch-size", "2"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), binary, binary, "--rounds", "2", "--", *tiny],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    ratios = done.stdout.strip().splitlines()[-1].split("ratio to base (median per round):")[1]
    values = dict(zip(ratios.split()[::2], map(float, ratios.split()[1::2])))
    assert set(values) == {"F", "I", "W"}
    assert all(0.2 < v < 5.0 for v in values.values()), values
