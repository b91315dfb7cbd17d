#!/bin/bash
# Runs every test suite of `make test` and prints the time each took.  A
# suite is a name, a lane and a command; add new suites to the table below.
# `scripts/test.sh NAME...` runs only the named suites, one after another.
#
# Two lanes run side by side when every suite runs: the `lab` lane holds
# the suites that bring up the lab (one lab per machine, so they queue on
# its lock anyway) and the `cpu` lane the ones that need no lab (lint, C
# unit tests, fuzzing, py-unit, schemathesis).  The cpu lane runs under
# `nice`, so the lab's TCG guests keep their share of the CPU.  On the
# 2-core CI machine the lanes cut `make test` from 2582 s (one after
# another, 2026-11-27, fresh clone of e8e6d22) to the lab lane's time plus
# what the cpu lane slows it by.  CUTPOINT_TEST_SERIAL=1 runs them one
# after another as before.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PYTEST="pytest -q -p no:cacheprovider --durations=10"

# name | lane | command
SUITES=(
  "lint|cpu|make --no-print-directory lint"
  "c-unit|cpu|meson test -C build --print-errorlogs"
  "c-asan|lab|scripts/build-asan.sh && meson test -C build-asan --print-errorlogs"
  "fuzz|cpu|scripts/fuzz.sh 60"
  "py-unit|cpu|$PYTEST -m 'not lab and not slow' api coordinator agent/client dr-tests"
  "lab|lab|$PYTEST -m 'lab and not slow and not fault' dr-tests/tests"
  "api-schemathesis|cpu|python api/tests/tools/run_schemathesis.py --max-examples 20"
  "api-lab|lab|$PYTEST -m 'lab and not slow and not fault' api/tests"
  "coordinator-lab|lab|$PYTEST -m 'lab and not slow and not fault' coordinator/tests"
  "agent-lab|lab|$PYTEST -m 'lab and not slow and not fault' agent/tests && scripts/build-asan.sh && CUTPOINTD=build-asan/agent/cutpointd $PYTEST -m 'lab and not slow and not fault' agent/tests/test_agent_local.py"
)
if [ "${CUTPOINT_SLOW:-0}" = 1 ]; then
  SUITES=(
    "slow|lab|$PYTEST -m slow api coordinator agent/client dr-tests"
  )
fi

want=("$@")
results=$(mktemp -d /tmp/cutpoint-test.XXXXXX)
trap 'rm -rf "$results"' EXIT

# run_lane LANE: the lane's suites in table order ("" = every suite); one
# line "name|seconds|status" per suite in $results/LANE.
run_lane() {
  local lane=$1 entry name rest slane cmd t0 rc dt st
  for entry in "${SUITES[@]}"; do
    name=${entry%%|*}; rest=${entry#*|}; slane=${rest%%|*}; cmd=${rest#*|}
    if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $name " ]]; then continue; fi
    if [ -n "$lane" ] && [ "$slane" != "$lane" ]; then continue; fi
    printf '\n=== suite %s: %s\n' "$name" "$cmd"
    t0=$(date +%s)
    bash -c "$cmd"; rc=$?
    # pytest exits 5 when a suite selects no test: that is a failure here,
    # because a suite that runs nothing proves nothing.
    dt=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then st=ok; else st="FAILED (rc=$rc)"; fi
    printf '=== suite %s: %s in %ss\n' "$name" "$st" "$dt"
    echo "$name|$dt|$st" >> "$results/${lane:-all}"
  done
}

t_all=$(date +%s)
if [ ${#want[@]} -eq 0 ] && [ "${CUTPOINT_TEST_SERIAL:-0}" != 1 ] && [ "${CUTPOINT_SLOW:-0}" != 1 ]; then
  mkdir -p out
  cpu_log=out/test-cpu-lane.log
  echo "test: the cpu lane runs beside the lab lane (nice); its output: $cpu_log, printed at the end"
  ( nice -n 10 bash -c "$(declare -p SUITES want results PYTEST); $(declare -f run_lane); run_lane cpu" ) > "$cpu_log" 2>&1 &
  cpu_pid=$!
  run_lane lab
  wait $cpu_pid
  printf '\n=== the cpu lane, run beside the lab lane (%s):\n' "$cpu_log"
  cat "$cpu_log"
  cat "$results/cpu" "$results/lab" > "$results/all" 2>/dev/null
else
  run_lane ""
fi

passed=0; failed=0
printf '\n%-16s %7s  %s\n' suite time result
while IFS='|' read -r name dt st; do
  printf '%-16s %6ss  %s\n' "$name" "$dt" "$st"
  if [ "$st" = ok ]; then passed=$((passed+1)); else failed=$((failed+1)); fi
done < "$results/all"
printf 'total %ss\n' "$(( $(date +%s) - t_all ))"
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
