"""pathprobe: throughput, RTT and loss between cloud regions, as Prometheus metrics."""

from . import build

# From git, when the package was built (build.py).
__version__ = build.VERSION
