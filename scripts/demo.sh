#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the lab demo: three regions on this machine,
# an exporter per host, Prometheus and Alertmanager, and a live table. Ctrl-C stops
# and removes everything. Extra arguments go to `pathprobe demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pathprobe demo --alertmanager-routing alerts/alertmanager.yml "$@"
