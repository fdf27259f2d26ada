#!/usr/bin/env python3
"""Compares two nobubble binaries' zb-auto plans under byte budgets where a fused backward B
is cheaper than I + W, on random seeded pipelines: p 2..5, m p..p+7, F, I, W and B (B below
I + W) the same on every stage, M_B in bytes, and budgets of k x M_B bytes for k 2..2p (or,
with --multiples, limits of k whole M_B: the ladder, where more memory must never plan worse).

Prints every case where the two differ, then the counts NEW shorter / equal / longer than OLD,
and how often a larger budget gave NEW a worse plan than a smaller one (byte budgets are not
monotone even for split plans).

Usage: docs/bench/compare_fused_bytes.py OLD_BINARY NEW_BINARY [CASES] [--seed N] [--multiples]
"""

import random

from compare_fused import plan_value, random_comparison_parser, ranked


def value(binary, p, m, cost, mem, k, objective, multiples):
    """The zb-auto plan's objective value at k x M_B, or None where it is refused."""
    args = ["-s", "zb-auto", "-p", str(p), "-m", str(m)]
    args += ["--cost", ",".join(f"{c:.3f}" for c in cost), "--mem", f"{mem},{mem // 2}"]
    limit = str(k) if multiples else f"{k * mem}B"
    return plan_value(binary, [*args, "--mem-limit", limit], objective)


def main():
    parser = random_comparison_parser(__doc__, 150)
    parser.add_argument(
        "--multiples", action="store_true", help="limits in whole M_B, not bytes"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = {"shorter": 0, "equal": 0, "longer": 0}
    worse_with_more = 0
    for _ in range(args.cases):
        p = rng.randint(2, 5)
        m = p + rng.randint(0, 7)
        f, i, w = (round(rng.uniform(0.5, 2.0), 3) for _ in range(3))
        b = round((i + w) * rng.uniform(0.4, 0.95), 3)
        mem = 1024 * rng.randint(50, 200)
        objective = rng.choice(["makespan", "span"])
        k = rng.randint(2, 2 * p)
        case = (p, m, (f, i, w, b), mem)
        old = value(args.old, *case, k, objective, args.multiples)
        new = value(args.new, *case, k, objective, args.multiples)
        if old is None or new is None:
            continue
        key, _ = ranked(new, old)
        counts[key] += 1
        if key != "equal":
            print(
                f"{key}: -p {p} -m {m} --cost {f},{i},{w},{b} --mem {mem},{mem // 2} "
                f"--mem-limit {k if args.multiples else f'{k * mem}B'} --objective {objective}: "
                f"old {old} new {new}"
            )
        more = value(args.new, *case, k + 1, objective, args.multiples)
        if more is not None and more > new + 1e-9:
            worse_with_more += 1
    print(
        f"{sum(counts.values())} cases: new shorter in {counts['shorter']}, equal in "
        f"{counts['equal']}, longer in {counts['longer']}; new worse with one more M_B in "
        f"{worse_with_more}"
    )


if __name__ == "__main__":
    main()
