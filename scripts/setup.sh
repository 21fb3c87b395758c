#!/usr/bin/env bash
# Installs what pathprobe's lab, demo and tests need, on Debian or Ubuntu, as root:
# the distribution's iperf3, Prometheus, Alertmanager and network tools, and the
# Python packages (pinned, with their dev tools) in .venv/. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# docker-compose (Compose v1) only parses docker-compose.yml in the tests; nothing runs containers.
# debootstrap builds the root filesystems of the Ansible deployment test's lab hosts,
# systemd-container boots them (systemd-nspawn) and Ansible reaches them over SSH;
# systemd's systemd-analyze checks the unit the role writes.
# gcc, libnetfilter-queue-dev and libmnl-dev build the lab's delay line (lab/delayline/).
# faketime runs an exporter with its clock ahead of its peers' in the clock-skew test.
# qemu-user-static and binfmt-support run an arm64 Debian's programs (the role's Graviton wheels).
# jsonnet (the C++ interpreter, 0.18 in Debian 12) evaluates mixin/mixin.libsonnet in tests/test_mixin.py,
# as a mixin user's tooling does.
packages=(iperf3 iproute2 nftables iptables iputils-ping procps python3-venv prometheus prometheus-alertmanager
  docker-compose debootstrap systemd-container openssh-client openssl systemd ethtool
  gcc libc6-dev libnetfilter-queue-dev libmnl-dev faketime qemu-user-static binfmt-support jsonnet)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The exporter (what hosts get) and the lab (this repository's tests and demo only).
if [ ! -x .venv/bin/pathprobe ] || [ exporter/pyproject.toml -nt .venv/.installed ] \
    || [ lab/pyproject.toml -nt .venv/.installed ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -e 'exporter[dev]' -e lab
  touch .venv/.installed
fi

# The lab's NFQUEUE delay line, compiled (lab/delayline/delayline.c says why); the lab runs it
# from .venv/bin.
if [ ! -x .venv/bin/pathprobe-delay-line ] || [ lab/delayline/delayline.c -nt .venv/bin/pathprobe-delay-line ]; then
  gcc -O2 -Wall -Wextra -Werror -std=gnu11 -o .venv/bin/pathprobe-delay-line.new lab/delayline/delayline.c \
    -lnetfilter_queue -lmnl
  mv .venv/bin/pathprobe-delay-line.new .venv/bin/pathprobe-delay-line
fi
