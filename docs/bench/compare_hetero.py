#!/usr/bin/env python3
"""Compares two nobubble binaries' zb-auto plans on random seeded heterogeneous pipelines:
p 2..6, m p..3p, a costs file of p or 2p stages each with its own F, I, W (0.5..2), M_B and
M_W = M_B / 2, a fused backward B below I + W on about 80% of the stages, comm 0..0.2; a
limit in bytes (one budget, or one per rank) of 1..1.6p times the largest stage's M_B (twice
that for 2p stages: two of them share a rank); the linear, V or automatic placement; makespan
or span. Plans are compared on the objective, then on the other of makespan and span.

Prints every case where the two differ (and any refused by one only), then the counts NEW
shorter / equal / longer than OLD.

Usage: docs/bench/compare_hetero.py OLD_BINARY NEW_BINARY [CASES] [--seed N] [--keep FOLDER]
(--keep writes each case's costs file into FOLDER, to re-run a printed case by hand)
"""

import json
import os
import random
import tempfile

from compare_fused import plan_values, random_comparison_parser, ranked

OTHER = {"makespan": "span", "span": "makespan"}


def random_case(rng, path):
    """A random pipeline, its costs file written to `path`: (plan arguments, objective)."""
    p = rng.randint(2, 6)
    m = rng.randint(p, 3 * p)
    count = rng.choice([p, 2 * p])
    stages = []
    for _ in range(count):
        f, i, w = (round(rng.uniform(0.5, 2.0), 3) for _ in range(3))
        mem_b = 1024 * rng.randint(50, 200)
        stage = {"f": f, "i": i, "w": w, "mem_b": mem_b, "mem_w": mem_b // 2}
        if rng.random() < 0.8:
            stage["b"] = round((i + w) * rng.uniform(0.4, 0.95), 3)
        stages.append(stage)
    with open(path, "w") as out:
        json.dump({"comm": round(rng.uniform(0, 0.2), 3), "stages": stages}, out)
    objective = rng.choice(["makespan", "span"])
    top = max(s["mem_b"] for s in stages) * (2 if count == 2 * p else 1)
    if rng.random() < 0.5:
        limit = f"{int(top * rng.uniform(1, 1.6 * p))}B"
    else:
        limit = ",".join(f"{int(top * rng.uniform(1, 1.6 * p))}B" for _ in range(p))
    placement = rng.choice(["linear", "v", "auto"])
    args = ["-s", "zb-auto", "-p", str(p), "-m", str(m), "--costs", path]
    args += ["--mem-limit", limit]
    if placement != "auto":
        args += ["--placement", placement]
    return args, objective


def main():
    parser = random_comparison_parser(__doc__, 175)
    parser.add_argument("--keep", help="a folder to keep the costs files in")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = {"shorter": 0, "equal": 0, "longer": 0}
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        os.makedirs(folder, exist_ok=True)
        for case in range(args.cases):
            path = os.path.join(folder, f"case{case}.json")
            plan_args, objective = random_case(rng, path)
            old = plan_values(args.old, plan_args, objective)
            new = plan_values(args.new, plan_args, objective)
            shown = " ".join(plan_args)
            if not args.keep:
                shown = shown.replace(path, f"<case {case}>")
            if old is None or new is None:
                if (old is None) != (new is None):
                    print(f"refused by one only: {shown}: old {old} new {new}")
                continue
            key, k = ranked(new, old)
            counts[key] += 1
            if key != "equal":
                which = objective if k == 0 else "then " + OTHER[objective]
                print(
                    f"{key}: {shown} --objective {objective}: {which} old {old[k]:.4f} "
                    f"new {new[k]:.4f} ({(new[k] - old[k]) / old[k] * 100:+.2f}%)"
                )
    print(
        f"{sum(counts.values())} cases: new shorter in {counts['shorter']}, equal in "
        f"{counts['equal']}, longer in {counts['longer']}"
    )


if __name__ == "__main__":
    main()
