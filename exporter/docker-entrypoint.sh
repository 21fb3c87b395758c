#!/bin/sh
# Optional shaping of the container's egress, to see the alerts and dashboards react
# (needs `cap_add: [NET_ADMIN]`):
#   PATHPROBE_SHAPE_RATE=500mbit   rate limit (tc tbf, or netem's rate with a delay)
#   PATHPROBE_SHAPE_DELAY=4ms      one-way delay (tc netem: Docker Desktop's and most
#                                  distributions' kernels have it)
set -e
if [ -n "$PATHPROBE_SHAPE_DELAY" ]; then
  tc qdisc replace dev eth0 root netem delay "$PATHPROBE_SHAPE_DELAY" ${PATHPROBE_SHAPE_RATE:+rate "$PATHPROBE_SHAPE_RATE"}
elif [ -n "$PATHPROBE_SHAPE_RATE" ]; then
  tc qdisc replace dev eth0 root tbf rate "$PATHPROBE_SHAPE_RATE" burst 256kb latency 50ms
fi
exec "$@"
