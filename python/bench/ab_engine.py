"""Two or more `nobubble` binaries' block passes (or training steps), alternating, as ratios.

    python python/bench/ab_engine.py BASE NEW [NEW2 ...] [--rounds 8] [--train] [-- args]

Why: on a shared VM a pass's time drifts by 10-20% over minutes (other tenants), far more
than the effect of one kernel change. Running ``nobubble bench engine`` with each binary in
turn, the order reversed every round, and taking the median of the per-round ratios cancels
the drift that two separate measurements would mix into the comparison. The default workload
is the PyTorch comparison's block (h 256, 4 heads, sequence 128, microbatch 8); arguments
after ``--`` go to ``bench engine`` as they are (e.g. ``-- --simd avx2``). With ``--train``
each run is ``nobubble train`` on the comparison's whole workload instead (4 blocks, 8
microbatches of 8, 2 ranks × 1 thread, zb-auto unless ``-- -s NAME``; 12 steps, the median step
after the first 3), and the ratio is of step times.

Build the base binary from another commit in its own worktree and target directory, e.g.
``git worktree add /tmp/base REV && cargo build --release --manifest-path /tmp/base/Cargo.toml
--target-dir /tmp/base-target -p nobubble``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = ["--hidden", "256", "--heads", "4", "--seq-len", "128", "--microbatch-size", "8"]
PASSES = [("F", "f_ms"), ("I", "i_ms"), ("W", "w_ms")]
TRAIN = [
    "--layers", "4", *WORKLOAD, "-m", "8", "-p", "2", "--threads-per-rank", "1",
    "--steps", "12", "--warmup", "2", "--eval-sets", "1",
]  # fmt: skip
SKIPPED_STEPS = 3  # the first steps (warm-up, re-planning on measured costs)


def with_overrides(defaults: list[str], extra: list[str]) -> list[str]:
    """``defaults`` (flag-value pairs) without the flags ``extra`` sets, then ``extra``."""
    given = {arg.split("=")[0] for arg in extra if arg.startswith("-")}
    kept = []
    for flag, value in zip(defaults[::2], defaults[1::2]):
        if flag not in given:
            kept += [flag, value]
    return kept + extra


def run(binary: str, extra: list[str]) -> dict:
    args = with_overrides([*WORKLOAD, "--repeat", "5"], extra)
    cmd = [binary, "bench", "engine", "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def train_step_ms(binary: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        cmd = [binary, "train", *with_overrides(TRAIN, extra), "--log", str(log)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
        rows = [json.loads(line) for line in log.read_text().splitlines()]
    if len(rows) <= SKIPPED_STEPS:
        sys.exit(f"--train needs more than {SKIPPED_STEPS} steps (they are skipped): use --steps")
    return {"step_ms": statistics.median(r["step_seconds"] for r in rows[SKIPPED_STEPS:]) * 1e3}


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs="+", help="the first is the base")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--train", action="store_true", help="compare training steps")
    args = parser.parse_args(argv)
    passes = [("step", "step_ms")] if args.train else PASSES
    measure = train_step_ms if args.train else run
    if len(args.binaries) < 2:
        parser.error("give at least two binaries: the base, then the ones to compare")
    # By position, not by path: a binary against itself measures the noise floor.
    binaries = list(enumerate(args.binaries))
    times = [{key: [] for _, key in passes} for _ in binaries]
    for r in range(args.rounds):
        for i, b in binaries if r % 2 == 0 else binaries[::-1]:
            result = measure(b, extra)
            for _, key in passes:
                times[i][key].append(result[key])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for i, b in binaries:
        medians = "  ".join(
            f"{name} {statistics.median(times[i][key]):6.2f} ms" for name, key in passes
        )
        line = f"{b}: {medians}"
        if i > 0:
            ratios = [
                statistics.median(x / y for x, y in zip(times[i][key], times[0][key]))
                for _, key in passes
            ]
            line += "   ratio to base (median per round): " + "  ".join(
                f"{name} {ratio:.3f}" for (name, _), ratio in zip(passes, ratios)
            )
        print(line)


if __name__ == "__main__":
    main()
