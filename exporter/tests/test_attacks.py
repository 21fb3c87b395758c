"""The attack suite against a real `pathprobe run` on loopback (bench/attacks.py, each
attack bounded in count and time): after every attack the exporter is up, a peer's probes
and an authorized scrape still work, RSS and open fds stay within the bench's bound, and the
table it prints shows what each attack was counted as (`pytest -s` prints it)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

BENCH = Path(__file__).parents[2] / "bench" / "attacks.py"


def test_every_attack_leaves_the_exporter_up_answering_and_bounded() -> None:
    # A hang guard: the suite takes 81 s alone; at nice 19 beside three labs and a root filesystem's
    # build (which CI has since moved before them) it took more than 300 s once.
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=600, check=False)
    print(proc.stdout)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 12, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Refusals are counted: every attack on an entry point that refuses shows up in its row.
    counted = {row.split(" | ")[0].strip("| "): row.split(" | ")[2] for row in rows}
    assert "rr malformed=200" in counted["rr_garbage"] and "not_allowed" in counted["strangers"]
    assert "header_too_large=30" in counted["metrics_credentials"], counted
