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
  # Phase 1: the unit and render tests, two at a time at the lowest CPU priority, beside the rollout
  # chaos module: ten minutes of a lab taking changes when the schedule's slots allow, which leaves
  # most of the CPU idle (in the last runs here the unit tests took 6.7-7.5 minutes beside it, and it took
  # 11.3-11.5 minutes with them or without). The slow test does not fit in what is left: it keeps more
  # than a core busy, and beside the chaos module it named its culprits only after 115 s of its 180 s
  # wait (68 s alone). Its output follows theirs once both have ended.
  chaos_log="${TMPDIR:-/tmp}/pathprobe-rollout-chaos.log"
  .venv/bin/pytest -v --durations=5 tests/test_rollout_chaos.py > "$chaos_log" 2>&1 &
  chaos=$!
  unit_status=0 chaos_status=0
  nice -n 19 .venv/bin/pytest -v -m "not lab and not slow and not alone" -n 2 --durations=20 exporter/tests tests ||
    unit_status=$?
  wait "$chaos" || chaos_status=$?
  cat "$chaos_log"
  if [ "$unit_status" -ne 0 ]; then exit "$unit_status"; fi
  if [ "$chaos_status" -ne 0 ]; then exit "$chaos_status"; fi
  # Phase 2: the other lab modules, the slow tests and the latency bounds, one at a time (one lab per machine).
  .venv/bin/pytest -v -m "lab or slow or alone" --durations=30 --ignore=tests/test_rollout_chaos.py exporter/tests tests
fi
