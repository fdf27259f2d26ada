"""nobubble's own engine and runtime against PyTorch, side by side, alternating, in one run.

    python python/bench/bench_engine.py [--arch gpt|llama] [--rounds 3] [--steps 8]

The workload (the PyTorch comparison's): a byte-level GPT, 4 blocks, hidden 256, 4 heads,
sequence 128, 8 microbatches of 8 sequences per step (8192 tokens), fp32, AdamW; with
``--arch llama`` the same shape with Llama blocks (RMSNorm, rotary positions, SwiGLU of width
704, 2 K/V heads, no biases) on both sides. Each round runs, in an order shuffled per round:

- ``nobubble train`` on 2 ranks × 1 thread under zb-auto (the default), zb-v and 1f1b; zb-auto
  again with ``NOBUBBLE_SIMD=avx2`` (the AVX2 kernels on the same CPU) and with
  ``NOBUBBLE_LEND_CORES=0`` (a waiting rank's core not lent to the other); and 1 rank × 2 threads
  (``--threads-per-rank 2``), the counterpart of PyTorch in one process;
- PyTorch in one process with 2 threads: the whole 64-sequence batch per step;
- PyTorch's pipeline runtime on 2 ranks × 1 thread (gloo): ``Schedule1F1B``,
  ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble`` and nobubble's zb-auto plan
  through ``PlannedSchedule`` (``bench_torch.py --variants uniform``).

Each figure is the median step time of a run after its first 3 steps (nobubble re-plans on
measured costs after step 2), then the median over the rounds. Tokens/s = 8192 / step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 8 * 8 * 128
MODEL = [
    "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-len", "128",
    "--microbatch-size", "8", "-m", "8",
]  # fmt: skip

NATIVE = {
    "nobubble zb-auto (2 ranks × 1 thread)": (["-p", "2", "-s", "zb-auto"], {}),
    "nobubble zb-v": (["-p", "2", "-s", "zb-v"], {}),
    "nobubble 1f1b": (["-p", "2", "-s", "1f1b"], {}),
    "nobubble zb-auto, AVX2 kernels": (["-p", "2", "-s", "zb-auto"], {"NOBUBBLE_SIMD": "avx2"}),
    "nobubble zb-auto, no lent cores": (["-p", "2", "-s", "zb-auto"], {"NOBUBBLE_LEND_CORES": "0"}),
    "nobubble 1 rank × 2 threads": (["-p", "1", "--threads-per-rank", "2"], {}),
}


def native_step_ms(
    binary: str, arch: str, args: list[str], env: dict[str, str], steps: int
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        cmd = [binary, "train", *MODEL, "--arch", arch, *args, "--steps", str(steps)]
        cmd += ["--warmup", "2"]
        cmd += ["--threads-per-rank", "1"] if "--threads-per-rank" not in args else []
        cmd += ["--eval-sets", "1", "--log", str(log)]
        done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        rows = [json.loads(line) for line in log.read_text().splitlines()]
    return statistics.median(r["step_seconds"] for r in rows[3:]) * 1e3


def torch_single_step_ms(arch: str, steps: int) -> float:
    """PyTorch in this process's child: 2 threads, the whole batch at once."""
    code = f"""
import statistics, time, torch
from torch import nn
from nobubble.torch.models import SAMPLE_TEXT, GPTConfig, byte_batches, gpt_layers, lm_loss
torch.set_num_threads(2)
cfg = GPTConfig(vocab=256, hidden=256, heads=4, blocks=4, seq_len=128, arch="{arch}")
model = nn.Sequential(*gpt_layers(cfg, seed=0))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = byte_batches(SAMPLE_TEXT, 64, 128, 4, seed=2)
times = []
for i in range({steps}):
    x, y = batches[i % len(batches)]
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    lm_loss(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t)
print(statistics.median(times[3:]) * 1e3)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    return float(out.stdout.strip().splitlines()[-1])


def torch_pipeline_step_ms(arch: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "torch.jsonl"
        cmd = [sys.executable, str(ROOT / "python/bench/bench_torch.py"), "--variants", "uniform"]
        cmd += ["--arch", arch]
        cmd += ["--rounds", "1", "--steps", "3", "--skip-planned-cut", "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        row = json.loads(out.read_text().splitlines()[-1])
    names = {"nobubble zb-auto": "PyTorch runtime, nobubble's zb-auto plan"}
    return {f"PyTorch {k}" if k not in names else names[k]: v for k, v in row["step_ms"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="steps per nobubble run")
    parser.add_argument("--nobubble", default=str(ROOT / "target/release/nobubble"))
    parser.add_argument("--json", help="write the medians here as JSON")
    args = parser.parse_args()
    if args.steps < 5 or args.rounds < 1:
        sys.exit("--steps must be at least 5 (the first 3 are warm-up) and --rounds at least 1")
    if not Path(args.nobubble).exists():
        sys.exit(f"{args.nobubble} does not exist; build it with `cargo build --release`")
    jobs = [(name, lambda a=a, e=e: native_step_ms(args.nobubble, args.arch, a, e, args.steps))
            for name, (a, e) in NATIVE.items()]  # fmt: skip
    jobs.append(
        ("PyTorch 1 process × 2 threads", lambda: torch_single_step_ms(args.arch, args.steps + 3))
    )
    jobs.append(("torch pipeline", None))
    times: dict[str, list[float]] = {}
    for r in range(args.rounds):
        # Shuffled, seeded by the round: a fixed rotation would have each system follow the
        # same one every round (the default always ran right after PyTorch's pipelines and
        # measured ~1% slower than the identical `NOBUBBLE_SIMD=avx2` run).
        order = list(jobs)
        random.Random(r).shuffle(order)
        for name, job in order:
            start = time.perf_counter()
            results = torch_pipeline_step_ms(args.arch) if job is None else {name: job()}
            for k, v in results.items():
                times.setdefault(k, []).append(v)
            took = time.perf_counter() - start
            print(f"round {r + 1}/{args.rounds}: {name} done in {took:.0f} s", file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in times.items()}
    pipelines = [v for k, v in medians.items() if k.startswith("PyTorch Schedule")]
    best_pipeline = min(pipelines)
    single = medians["PyTorch 1 process × 2 threads"]
    header = ["tokens/s", "step ms", "× best PT pipeline", "× PT 1 proc"]
    print(f"{'system':48} {header[0]:>9} {header[1]:>9} {header[2]:>19} {header[3]:>11}")
    for k, v in sorted(medians.items(), key=lambda kv: kv[1]):
        spread = f"{min(times[k]):.0f}–{max(times[k]):.0f}"
        print(
            f"{k:48} {TOKENS / v * 1e3:>9.0f} {v:>9.1f} {best_pipeline / v:>19.2f} "
            f"{single / v:>11.2f}   (rounds {spread} ms)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"step_ms": times, "median_ms": medians}, indent=1))


if __name__ == "__main__":
    main()
