#!/bin/bash
# Compares two nobubble binaries' V plans (zb-auto --placement v) on a grid: three cost models
# (F = I = W; the paper's 1/1.2/0.8 with comm 0.05; the paper's 1.5B costs) x p 4, 8 x m p, 2p,
# 3p x four limits (p/4 + 0.5, 3p/8 + 0.5, p/2 + 0.5, 3p/4 times M_B) x both objectives, and
# prints every cell where the second is shorter or longer on the objective, then the counts.
# Usage: docs/bench/compare_v_plans.sh OLD_BINARY NEW_BINARY
set -euo pipefail
old=$1
new=$2
shorter=0 equal=0 longer=0
value() { # binary, objective, plan arguments...
  local bin=$1 objective=$2
  shift 2
  "$bin" plan -s zb-auto --placement v --objective "$objective" --format json "$@" |
    python3 -c "import json, sys; d = json.load(sys.stdin); print(d['makespan'] if sys.argv[1] == 'makespan' else max(d['span']))" "$objective"
}
for costs in "--cost 1,1,1 --mem 1,0.5" "--cost 1,1.2,0.8 --comm 0.05 --mem 1,0.5" \
  "--cost 18522,18086,9337 --comm 601 --mem 1,0.366"; do
  for p in 4 8; do
    for m in $p $((2 * p)) $((3 * p)); do
      for x in $(python3 -c "p = $p; print(p / 4 + 0.5, p * 0.375 + 0.5, p / 2 + 0.5, p * 0.75)"); do
        for objective in makespan span; do
          # shellcheck disable=SC2086
          a=$(value "$old" $objective -p $p -m $m $costs --mem-limit $x)
          # shellcheck disable=SC2086
          b=$(value "$new" $objective -p $p -m $m $costs --mem-limit $x)
          verdict=$(python3 -c "a, b = $a, $b; print('shorter' if b < a * (1 - 1e-9) else 'longer' if b > a * (1 + 1e-9) else 'equal')")
          case $verdict in
            shorter) shorter=$((shorter + 1)) ;;
            longer) longer=$((longer + 1)) ;;
            *) equal=$((equal + 1)) ;;
          esac
          [ "$verdict" = equal ] || echo "$verdict: p $p m $m x $x $objective ($costs): $a -> $b"
        done
      done
    done
  done
done
echo "shorter $shorter, equal $equal, longer $longer"
