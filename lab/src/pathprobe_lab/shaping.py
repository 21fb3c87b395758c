"""Shaping the lab's paths: rate (HTB on the router, per source), loss (nftables numgen)
and one-way delay (iptables NFQUEUE to the delay line, which this module starts, restarts if
it died, and tells a path's new delay). Used by `lab up` and by impair/restore.

The delay line is the compiled `pathprobe-delay-line` (lab/delayline/delayline.c, built into
the venv by scripts/setup.sh); `PATHPROBE_LAB_DELAY_LINE=python` runs the Python one
(delayline.py) instead, which bench/lab_fidelity.py measures beside it."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pathprobe import procs

from . import caps
from .state import NFT_TABLE, ROUTER, STATE_DIR, LabError, State, in_ns, iptables, sh
from .topology import PathSpec, resolve

# The caps of a host (topology.LabHost) that set_host_cap changes.
HostCap = Literal["per_flow_cap", "transit_gateway_cap"]


def apply_shaping(state: State) -> None:
    topo = state.topo()
    hosts = [h.name for h in topo.hosts]
    for j, dst in enumerate(hosts, start=1):
        _rate(j, [(i, state.spec(src, dst)) for i, src in enumerate(hosts, start=1) if src != dst])
    _loss(state, hosts)
    _delay(state, hosts)


def _rate(dst_index: int, sources: list[tuple[int, PathSpec]]) -> None:
    """One HTB class per source on the router's link towards the destination."""
    dev = f"r{dst_index}"
    tc = ["tc", "-n", ROUTER]
    sh([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
    shaped = [(i, s.rate) for i, s in sources if s.rate]
    if not shaped:
        return
    # No default class: traffic from the root namespace (scrapes) passes unshaped.
    sh([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb"])
    for i, bits_per_second in shaped:
        rate = f"{bits_per_second:.0f}bit"
        sh(
            [
                *tc,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                f"1:{i}",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
                *caps.htb_buckets(bits_per_second).split(),
            ]
        )
        sh(
            [
                *tc,
                "filter",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "src",
                f"198.18.{i}.0/24",
                "flowid",
                f"1:{i}",
            ]
        )


def _pairs(state: State, hosts: list[str]) -> list[tuple[int, int, PathSpec]]:
    return [
        (i, j, state.spec(a, b)) for i, a in enumerate(hosts, start=1) for j, b in enumerate(hosts, start=1) if a != b
    ]


def _loss(state: State, hosts: list[str]) -> None:
    rules = [
        f"ip saddr 198.18.{i}.0/24 ip daddr 198.18.{j}.0/24 numgen random mod 1000000 < {round(s.loss * 1e6)} "
        "counter drop"
        for i, j, s in _pairs(state, hosts)
        if s.loss > 0
    ]
    # Replace the rules, never the table or its chain, in one transaction: unregistering a
    # netfilter hook in the router's namespace (deleting a base chain) makes the kernel flush
    # every NFQUEUE queue there (nfqnl_nf_hook_drop), dropping each packet the delay line holds,
    # on every path, silently (its queue counters stay 0).
    script = (
        f"table inet {NFT_TABLE} {{\n  chain wan {{\n    type filter hook forward priority -10; policy accept;\n"
        f"  }}\n}}\nflush chain inet {NFT_TABLE} wan\n"
    )
    script += "".join(f"add rule inet {NFT_TABLE} wan {r}\n" for r in rules)
    sh(in_ns(ROUTER, ["nft", "-f", "-"]), input_text=script)


def queue_number(i: int, j: int) -> int:
    return i * 256 + j


# The compiled delay line's control socket (delayline.c's usage says what it takes).
DELAY_LINE_CONTROL = STATE_DIR / "delay-line.sock"


def _delay(state: State, hosts: list[str]) -> None:
    """Each delayed path's packets to a queue of its own in the delay line. A running line takes
    new delays through its control socket (a restart, which a line that cannot take them gets,
    would drop the packets every path holds and let packets through undelayed meanwhile, so one
    path's delay change would cost the other paths' tests); then the rules are replaced in one
    transaction, which leaves the queues' packets alone."""
    queues = {queue_number(i, j): s.one_way_delay for i, j, s in _pairs(state, hosts) if s.one_way_delay > 0}
    running = next(
        (p for p in state.processes if p["what"] == "delay-line" and "control" in p and procs.alive(p["pid"])), None
    )
    if running is not None and _told(running, queues):
        state.save()
    else:
        _restart_delay_line(state, queues)
    # --queue-bypass: if the delay line is gone, packets pass undelayed (lab status says so).
    rules = "".join(
        f"-A FORWARD -s 198.18.{q // 256}.0/24 -d 198.18.{q % 256}.0/24 -j NFQUEUE --queue-num {q} --queue-bypass\n"
        for q in sorted(queues)
    )
    sh(in_ns(ROUTER, [f"{iptables()}-restore", "--noflush"]), input_text=f"*filter\n-F FORWARD\n{rules}COMMIT\n")


def _told(running: dict[str, Any], queues: dict[int, float]) -> bool:
    """Whether the running line took these delays from now on (it binds a queue it lacks; one
    it is not told of keeps its delay for what it holds, and its rule goes)."""
    line = " ".join(f"{q}:{d!r}" for q, d in sorted(queues.items())) + "\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
            control.settimeout(10)
            control.connect(running["control"])
            control.sendall(line.encode())
            answer = control.makefile().readline().strip()
    except OSError:
        return False
    if answer == "ok":
        running["queues"] = queues
    return answer == "ok"


def _restart_delay_line(state: State, queues: dict[int, float]) -> None:
    current = [p for p in state.processes if p["what"] == "delay-line"]
    if (
        len(current) == 1
        and procs.alive(current[0]["pid"])
        and {int(q): d for q, d in current[0]["queues"].items()} == queues
    ):
        return  # nothing changed: do not open a window without delay
    for proc in current:
        procs.terminate(proc["pid"])
        state.processes.remove(proc)
    if queues:
        cmd = in_ns(ROUTER, delay_line_command(queues))
        log_path = STATE_DIR / "delay-line.log"
        with log_path.open("ab") as log_file:
            child = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL, start_new_session=True
            )
        record = {"pid": child.pid, "what": "delay-line", "queues": queues}
        if not _python_delay_line():
            record["control"] = str(DELAY_LINE_CONTROL)
        state.processes.append(record)
        state.save()
        # It prints "ready" once every queue is bound; until then packets would pass undelayed.
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 10)
        line = child.stdout.readline().decode().strip() if ready else ""
        child.stdout.close()
        if line != "ready":
            raise LabError(f"the delay line did not start: {log_path.read_text()[-500:]}")
    state.save()


def _python_delay_line() -> bool:
    """The Python reference (bench/lab_fidelity.py) instead of the compiled line; it has no
    control socket, so each delay change restarts it."""
    return os.environ.get("PATHPROBE_LAB_DELAY_LINE") == "python"


def delay_line_command(queues: dict[int, float]) -> list[str]:
    if _python_delay_line():
        return [sys.executable, "-m", "pathprobe_lab.delayline", "--queues", json.dumps(queues)]
    venv_bin = str(Path(sys.executable).parent)
    binary = shutil.which("pathprobe-delay-line", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if binary is None:
        raise LabError(f"pathprobe-delay-line is not built (not in {venv_bin} nor PATH): run scripts/setup.sh")
    return [binary, "--control", str(DELAY_LINE_CONTROL), *(f"{q}:{d!r}" for q, d in sorted(queues.items()))]


def ensure_delay_line(state: State) -> bool:
    """Restart the delay line if it died; True when it had to."""
    for proc in state.processes:
        if proc["what"] == "delay-line" and not procs.alive(proc["pid"]):
            queues = {int(q): d for q, d in proc["queues"].items()}
            _restart_delay_line(state, queues)
            return True
    return False


def set_path(state: State, src: str, dst: str, spec: PathSpec) -> None:
    """One directed path's shaping. Only what changed is applied again: a rate re-creates the
    qdisc of the router's link towards dst (which the other paths into dst share), a loss the
    loss table (one nft transaction), a delay that path's queue in the running delay line (_delay).
    So a rate or loss change leaves the queues and packets of the paths into other hosts alone,
    and no change drops the packets the delay line holds for another path (see _loss, _delay)."""
    state.index(src)  # validates the name
    j = state.index(dst)
    before = state.spec(src, dst)
    state.paths[f"{src}>{dst}"] = asdict(spec)
    state.save()
    hosts = [h.name for h in state.topo().hosts]
    if spec.rate != before.rate:
        _rate(j, [(k, state.spec(other, dst)) for k, other in enumerate(hosts, start=1) if other != dst])
    if spec.loss != before.loss:
        _loss(state, hosts)
    if spec.one_way_delay != before.one_way_delay:
        _delay(state, hosts)


def set_host_cap(state: State, host: str, cap: HostCap, rate: float | None) -> None:
    """Lower (or, with None, restore) one AWS host's per-flow cap or Transit Gateway attachment
    (caps.py); the other hosts' caps are left alone."""
    state.topology["hosts"][state.index(host) - 1][cap] = rate
    state.save()
    caps.apply(state.topo(), only=host)


def restore(state: State, src: str, dst: str) -> PathSpec:
    spec = resolve(state.topo())[(src, dst)]
    set_path(state, src, dst, spec)
    return spec
