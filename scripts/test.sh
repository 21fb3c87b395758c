#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every check: lint, types, unit tests,
# then integration tests against real namespaces, iperf3, Prometheus and Alertmanager.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Ansible test's root filesystem (debootstrap: minutes on a fresh machine) is built meanwhile,
# at the lowest CPU and I/O priority; the test waits for it (tests/rootfs.py).
nice -n 19 ionice -c 3 .venv/bin/python tests/rootfs.py > "${TMPDIR:-/tmp}/pathprobe-rootfs-build.log" 2>&1 &
.venv/bin/ruff check exporter lab tests bench dashboards
.venv/bin/ruff format --check exporter lab tests bench dashboards
(cd exporter && ../.venv/bin/mypy src)
(cd lab && ../.venv/bin/mypy src)
(cd dashboards && ../.venv/bin/mypy --strict --ignore-missing-imports generate.py pathprobe_dashboards)
.venv/bin/pytest -v --durations=40 exporter/tests tests "$@"
