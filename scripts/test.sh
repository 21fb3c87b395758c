#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every check: lint, types, unit tests,
# then integration tests against real namespaces, iperf3, Prometheus and Alertmanager.
#   --quick: lint, types, the unit and render tests, two at a time (no lab, no root, nothing slow or heavy: minutes).
# Further arguments (after --quick, if any) name the tests to run, as pytest takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=false
if [ "${1:-}" = "--quick" ]; then
  quick=true
  shift
fi
bash scripts/setup.sh
if ! $quick; then
  # The Ansible tests' root filesystems (debootstrap: minutes on a fresh machine) are built meanwhile,
  # at the lowest CPU and I/O priority; a test waits for its own (tests/rootfs.py).
  nice -n 19 ionice -c 3 .venv/bin/python tests/rootfs.py > "${TMPDIR:-/tmp}/pathprobe-rootfs-build.log" 2>&1 &
fi
.venv/bin/ruff check exporter lab tests bench dashboards
.venv/bin/ruff format --check exporter lab tests bench dashboards
(cd exporter && ../.venv/bin/mypy src)
(cd lab && ../.venv/bin/mypy src)
(cd dashboards && ../.venv/bin/mypy --strict --ignore-missing-imports generate.py pathprobe_dashboards)
if $quick; then
  if [ $# -eq 0 ]; then set -- exporter/tests tests; fi
  .venv/bin/pytest -q -m "not lab and not slow and not heavy" -n 2 --durations=15 "$@"
elif [ $# -gt 0 ]; then  # the tests named
  .venv/bin/pytest -v "$@"
else
  # Phase 1: the unit, render and heavy tests, two at a time at the lowest CPU priority, then the slow
  # ones, all beside the rollout chaos module: ten minutes of a lab taking changes when the schedule's
  # slots allow, which leaves most of the CPU idle (in the last run here the unit tests took 7.5 minutes
  # beside it, and it took 11.4). The slow test (a real Prometheus evaluating the
  # culprit rules over a 1,000-host fleet, 4 minutes, half a core) runs after the unit tests, not
  # beside them: beside two of them its rules fell behind. Its output follows theirs once all have ended.
  chaos_log="${TMPDIR:-/tmp}/pathprobe-rollout-chaos.log"
  .venv/bin/pytest -v --durations=5 tests/test_rollout_chaos.py > "$chaos_log" 2>&1 &
  chaos=$!
  unit_status=0 slow_status=0 chaos_status=0
  nice -n 19 .venv/bin/pytest -v -m "not lab and not slow and not alone" -n 2 --durations=20 exporter/tests tests ||
    unit_status=$?
  nice -n 19 .venv/bin/pytest -v -m "slow and not lab" --durations=5 exporter/tests tests || slow_status=$?
  wait "$chaos" || chaos_status=$?
  cat "$chaos_log"
  for status in "$unit_status" "$slow_status" "$chaos_status"; do
    if [ "$status" -ne 0 ]; then exit "$status"; fi
  done
  # Phase 2: the other lab modules and the latency bounds, one at a time (one lab per machine).
  .venv/bin/pytest -v -m "lab or alone" --durations=30 --ignore=tests/test_rollout_chaos.py exporter/tests tests
fi
