#!/usr/bin/env bash
# Runs a command (root) in a network namespace and a mount namespace of its own, so that a lab
# it brings up lives beside the machine's: its namespaces (/run/netns), state (/run/pathprobe-lab),
# root link, routes, firewall tables, ports on 127.0.0.1, and the test session's lab lock ($TMPDIR)
# are its own, and its `lab down` cannot see another lab. The kernel and the CPU stay shared, and so
# does net.ipv4.tcp_allowed_congestion_control: a lab that must extend it comes up only outside.
# It has no route out of the machine.
#   scripts/isolated.sh CMD [ARGS...]
set -euo pipefail
mkdir -p /run/netns /run/pathprobe-lab
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pathprobe-isolated.XXXXXX")
# unshare makes every mount private first: what is mounted inside never reaches the machine's view.
exec unshare --mount --net -- sh -c '
  mount -t tmpfs -o mode=0755 pathprobe-netns /run/netns &&
  mount -t tmpfs -o mode=0755 pathprobe-lab /run/pathprobe-lab &&
  ip link set lo up &&
  exec "$@"' isolated env TMPDIR="$tmp" "$@"
