#!/bin/bash
# Runs every test suite of `make test`, one after another, and prints the
# time each took.  A suite is a name and a command; add new suites to the
# table below.  `scripts/test.sh NAME...` runs only the named suites.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PYTEST="pytest -q -p no:cacheprovider --durations=10"

# name | command
SUITES=(
  "lint|make --no-print-directory lint"
  "c-unit|meson test -C build --print-errorlogs"
  "c-asan|scripts/build-asan.sh && meson test -C build-asan --print-errorlogs"
  "fuzz|scripts/fuzz.sh 60"
  "py-unit|$PYTEST -m 'not lab and not slow' api coordinator agent/client dr-tests"
  "lab|$PYTEST -m 'lab and not slow and not fault' dr-tests/tests"
  "api-schemathesis|python api/tests/tools/run_schemathesis.py --max-examples 20"
  "api-lab|$PYTEST -m 'lab and not slow and not fault' api/tests"
  "coordinator-lab|$PYTEST -m 'lab and not slow and not fault' coordinator/tests"
  "agent-lab|$PYTEST -m 'lab and not slow and not fault' agent/tests && scripts/build-asan.sh && CUTPOINTD=build-asan/agent/cutpointd $PYTEST -m 'lab and not slow and not fault' agent/tests/test_agent_local.py"
)
if [ "${CUTPOINT_SLOW:-0}" = 1 ]; then
  SUITES=(
    "slow|$PYTEST -m slow api coordinator agent/client dr-tests"
  )
fi

want=("$@")
passed=0; failed=0; report=()
t_all=$(date +%s)
for entry in "${SUITES[@]}"; do
  name=${entry%%|*}; cmd=${entry#*|}
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $name " ]]; then continue; fi
  printf '\n=== suite %s: %s\n' "$name" "$cmd"
  t0=$(date +%s)
  bash -c "$cmd"; rc=$?
  # pytest exits 5 when a suite selects no test: that is a failure here,
  # because a suite that runs nothing proves nothing.
  dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then passed=$((passed+1)); st=ok; else failed=$((failed+1)); st="FAILED (rc=$rc)"; fi
  report+=("$(printf '%-14s %6ss  %s' "$name" "$dt" "$st")")
  printf '=== suite %s: %s in %ss\n' "$name" "$st" "$dt"
done
printf '\n%-14s %7s  %s\n' suite time result
printf '%s\n' "${report[@]}"
printf 'total %ss\n' "$(( $(date +%s) - t_all ))"
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ]
