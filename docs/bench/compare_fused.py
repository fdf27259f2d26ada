#!/usr/bin/env python3
"""Compares two nobubble binaries' zb-auto plans where a fused backward B is cheaper than
I + W, and both against the fixed schedules, on a grid: F = I = W = 1 and B 1.2, 1.5, 1.8;
p 2, 4, 8; m p, 2p, 3p; limits p/2 (at least 1), p and 1.5p times M_B; the objective given.

Prints every cell where a fixed schedule (1f1b, dualpipe-v, zb-v, interleaved-1f1b, zb-h1,
gpipe, at the same limit) beats NEW, then the counts: NEW shorter / equal / longer than OLD.

Usage: docs/bench/compare_fused.py OLD_BINARY NEW_BINARY [--objective makespan|span]
"""

import argparse
import itertools
import json
import subprocess

FIXED = ["1f1b", "dualpipe-v", "zb-v", "interleaved-1f1b", "zb-h1", "gpipe"]


def plan_values(binary, args, objective):
    """`nobubble plan ARGS`'s objective value and then the other of makespan and the longest
    span (the planner's tie-break), or None where the plan is refused."""
    cmd = [binary, "plan", *args, "--objective", objective, "-f", "json"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode:
        return None
    d = json.loads(out.stdout)
    makespan, span = d["makespan"], max(d["span"])
    return (makespan, span) if objective == "makespan" else (span, makespan)


def plan_value(binary, args, objective):
    """`nobubble plan ARGS`'s objective value, or None where the plan is refused."""
    values = plan_values(binary, args, objective)
    return values and values[0]


def ranked(new, old):
    """Whether `new` is "shorter", "equal" or "longer" than `old` (numbers, or tuples compared
    in order: the objective, then the tie-break), with the planner's relative tolerance of
    1e-9; and the index of the number that decided (None when equal)."""
    new, old = (new, old) if isinstance(new, tuple) else ((new,), (old,))
    for k, (n, o) in enumerate(zip(new, old)):
        if n < o - 1e-9 * abs(o):
            return "shorter", k
        if n > o + 1e-9 * abs(o):
            return "longer", k
    return "equal", None


def random_comparison_parser(doc, cases):
    """The arguments every random comparison takes: the two binaries, how many cases and
    the seed."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("cases", nargs="?", type=int, default=cases)
    parser.add_argument("--seed", type=int, default=1)
    return parser


def value(binary, schedule, p, m, b, limit, objective):
    """The plan's objective value, or None where the schedule is refused (limit, shape)."""
    args = ["-s", schedule, "-p", str(p), "-m", str(m), "--cost", f"1,1,1,{b}"]
    return plan_value(binary, [*args, "--mem-limit", str(limit)], objective)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--objective", default="makespan", choices=["makespan", "span"])
    args = parser.parse_args()
    counts = {"shorter": 0, "equal": 0, "longer": 0}
    beaten = 0
    for p, mf, b, lf in itertools.product(
        [2, 4, 8], [1, 2, 3], [1.2, 1.5, 1.8], [0.5, 1, 1.5]
    ):
        m, limit = p * mf, max(1, p * lf)
        old = value(args.old, "zb-auto", p, m, b, limit, args.objective)
        new = value(args.new, "zb-auto", p, m, b, limit, args.objective)
        if old is None or new is None:
            continue
        key, _ = ranked(new, old)
        counts[key] += 1
        fixed = [
            (v, s)
            for s in FIXED
            if (v := value(args.new, s, p, m, b, limit, args.objective))
        ]
        if fixed and min(fixed)[0] < new - 1e-9:
            beaten += 1
            best = min(fixed)
            print(
                f"p {p} m {m} B {b} limit {limit}: old {old:.2f} new {new:.2f}, {best[1]} {best[0]:.2f}"
            )
    print(
        f"{sum(counts.values())} cells: new shorter in {counts['shorter']}, equal in "
        f"{counts['equal']}, longer in {counts['longer']}; a fixed schedule shorter in {beaten}"
    )


if __name__ == "__main__":
    main()
