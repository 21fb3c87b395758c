#!/bin/sh
# Runs as the image's user pathprobe; tc and nft hold CAP_NET_ADMIN as file capabilities,
# effective where the container is granted it (`cap_add: [NET_ADMIN]`).
#   PATHPROBE_FIREWALL=1           `pathprobe firewall --apply` first: only the peers reach the
#                                  iperf3 port (nftables, in the container's network namespace)
# Optional shaping of the container's egress, to see the alerts and dashboards react:
#   PATHPROBE_SHAPE_RATE=500mbit   rate limit (tc tbf, or netem's rate with a delay)
#   PATHPROBE_SHAPE_DELAY=4ms      one-way delay (tc netem: Docker Desktop's and most
#                                  distributions' kernels have it)
set -e
if [ "$PATHPROBE_FIREWALL" = 1 ]; then
  pathprobe firewall --config "${PATHPROBE_CONFIG:-/etc/pathprobe/pathprobe.yaml}" --apply
fi
if [ -n "$PATHPROBE_SHAPE_DELAY" ]; then
  tc qdisc replace dev eth0 root netem delay "$PATHPROBE_SHAPE_DELAY" ${PATHPROBE_SHAPE_RATE:+rate "$PATHPROBE_SHAPE_RATE"}
elif [ -n "$PATHPROBE_SHAPE_RATE" ]; then
  tc qdisc replace dev eth0 root tbf rate "$PATHPROBE_SHAPE_RATE" burst 256kb latency 50ms
fi
exec "$@"
