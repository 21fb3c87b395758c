#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every check: lint, types, unit tests,
# then integration tests against real namespaces, iperf3, Prometheus and Alertmanager.
#   --quick: lint, types, the unit and render tests, two at a time (no lab, no root, nothing slow: minutes).
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
  .venv/bin/pytest -q -m "not lab and not slow" -n 2 --durations=15 "$@"
elif [ $# -gt 0 ]; then  # the tests named
  .venv/bin/pytest -v "$@"
else
  # The unit and render tests two at a time, then the lab's one at a time (one lab per machine).
  .venv/bin/pytest -v -m "not lab and not slow" -n 2 --durations=20 exporter/tests tests
  .venv/bin/pytest -v -m "lab or slow" --durations=30 tests
fi
