"""pathprobe: throughput, RTT and loss between cloud regions, as Prometheus metrics."""

__version__ = "0.1.0"
