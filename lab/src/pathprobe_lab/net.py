"""Build, change, inspect and tear down the lab: network namespaces joined by a
router namespace, with per-path rate (HTB), loss (nftables numgen) and delay
(NFQUEUE delay line).

This drives iproute2, nft and iptables rather than netlink directly (pyroute2):
the lab is something people rehearse with and debug by hand, and `--verbose`
prints the very commands they can re-run. Everything the lab makes is either
inside its namespaces (gone with them) or recorded in the state file by PID.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .topology import PathSpec, Topology, address, resolve

log = logging.getLogger(__name__)

PREFIX = "pp-"
ROUTER = PREFIX + "router"
ROOT_LINK = PREFIX + "root"
STATE_DIR = Path(os.environ.get("PATHPROBE_LAB_STATE", "/run/pathprobe-lab"))
NFT_TABLE = "pathprobe_lab"


class LabError(Exception):
    pass


def sh(cmd: list[str], input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    log.debug("+ %s", shlex.join(cmd))
    proc = subprocess.run(cmd, input=input_text, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"command failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stderr.strip()}")
    return proc


def ns(host: str) -> str:
    return PREFIX + host


def in_ns(namespace: str, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", namespace, *cmd]


@dataclass
class State:
    topology: dict  # type: ignore[type-arg]  # the Topology as JSON, to rebuild PathSpecs
    paths: dict[str, dict]  # type: ignore[type-arg]  # "src>dst" -> PathSpec fields, as configured now
    processes: list[dict] = field(default_factory=list)  # type: ignore[type-arg]  # {pid, what}
    # Root-namespace sysctls the lab changed, with the values to put back on `down`.
    restore_sysctls: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def file() -> Path:
        return STATE_DIR / "state.json"

    @classmethod
    def load(cls) -> State | None:
        try:
            return cls(**json.loads(cls.file().read_text()))
        except FileNotFoundError:
            return None

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.file().with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.file())

    def topo(self) -> Topology:
        return Topology.model_validate(self.topology)

    def spec(self, src: str, dst: str) -> PathSpec:
        return PathSpec(**self.paths[f"{src}>{dst}"])

    def index(self, host: str) -> int:
        for i, h in enumerate(self.topo().hosts, start=1):
            if h.name == host:
                return i
        raise LabError(f"no host {host!r} in the lab (hosts: {', '.join(h.name for h in self.topo().hosts)})")


def require_tools() -> None:
    missing = [t for t in ("ip", "tc", "nft", iptables()) if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)} (apt-get install iproute2 nftables iptables)")
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, qdiscs, firewall rules)")


def iptables() -> str:
    # Legacy iptables keeps the NFQUEUE rules apart from the nft table that drops.
    return "iptables-legacy" if shutil.which("iptables-legacy") else "iptables"


# --- up ---------------------------------------------------------------------
def up(topo: Topology) -> State:
    require_tools()
    if State.load() is not None or _namespaces():
        raise LabError("a lab is already up (or left over): run `pathprobe lab down` first")
    paths = {f"{a}>{b}": asdict(spec) for (a, b), spec in resolve(topo).items()}
    state = State(topology=topo.model_dump(mode="json"), paths=paths)
    state.save()  # first, so that `lab down` can clean up after a failure below
    try:
        _allow_congestion_controls(state, {h.congestion for h in topo.hosts if h.congestion})
        _build(topo)
        apply_shaping(state)
    except Exception:
        down()
        raise
    return state


def _allow_congestion_controls(state: State, wanted: set[str]) -> None:
    """A namespace may only pick from the root namespace's allowed list; extend it while the lab is up."""
    key = "net.ipv4.tcp_allowed_congestion_control"
    allowed = sh(["sysctl", "-n", key]).stdout.split()
    missing = sorted(wanted - set(allowed))
    if missing:
        state.restore_sysctls[key] = " ".join(allowed)
        state.save()
        sh(["sysctl", "-qw", f"{key}={' '.join(allowed + missing)}"])


def _build(topo: Topology) -> None:
    sh(["ip", "netns", "add", ROUTER])
    router = ["ip", "-n", ROUTER]
    sh([*router, "link", "set", "lo", "up"])
    sh(in_ns(ROUTER, ["sysctl", "-qw", "net.ipv4.ip_forward=1"]))
    # The root namespace reaches every lab host through the router (for Prometheus
    # and the browser), on a link that is never shaped.
    sh(["ip", "link", "add", ROOT_LINK, "type", "veth", "peer", "name", "r0", "netns", ROUTER])
    sh(["ip", "addr", "add", "198.18.0.1/24", "dev", ROOT_LINK])
    sh(["ip", "link", "set", ROOT_LINK, "up"])
    sh([*router, "addr", "add", "198.18.0.2/24", "dev", "r0"])
    sh([*router, "link", "set", "r0", "up"])
    sh(["ip", "route", "add", "198.18.0.0/15", "via", "198.18.0.2", "dev", ROOT_LINK])
    for i, host in enumerate(topo.hosts, start=1):
        name = ns(host.name)
        sh(["ip", "netns", "add", name])
        sh(["ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"r{i}", "netns", ROUTER])
        h = ["ip", "-n", name]
        sh([*h, "link", "set", "lo", "up"])
        sh([*h, "addr", "add", f"{address(i)}/24", "dev", "eth0"])
        sh([*h, "link", "set", "eth0", "up"])
        sh([*h, "route", "add", "default", "via", f"198.18.{i}.1"])
        sh([*router, "addr", "add", f"198.18.{i}.1/24", "dev", f"r{i}"])
        sh([*router, "link", "set", f"r{i}", "up"])
        sysctls = []
        if host.tcp_rmem_max:
            sysctls.append(f"net.ipv4.tcp_rmem=4096 131072 {host.tcp_rmem_max}")
        if host.tcp_wmem_max:
            sysctls.append(f"net.ipv4.tcp_wmem=4096 16384 {host.tcp_wmem_max}")
        if host.congestion:
            sysctls.append(f"net.ipv4.tcp_congestion_control={host.congestion}")
        for setting in sysctls:
            sh(in_ns(name, ["sysctl", "-qw", setting]))


# --- shaping (also used by impair/restore) ----------------------------------
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
    shaped = [(i, s) for i, s in sources if s.rate]
    if not shaped:
        return
    # No default class: traffic from the root namespace (scrapes) passes unshaped.
    sh([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb"])
    for i, spec in shaped:
        rate = f"{spec.rate:.0f}bit"
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
                "burst",
                "256kb",
                "cburst",
                "256kb",
                "quantum",
                "200000",
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
    return [(i, j, state.spec(a, b)) for i, a in enumerate(hosts, start=1)
            for j, b in enumerate(hosts, start=1) if a != b]  # fmt: skip


def _loss(state: State, hosts: list[str]) -> None:
    rules = [
        f"ip saddr 198.18.{i}.0/24 ip daddr 198.18.{j}.0/24 numgen random mod 1000000 < {round(s.loss * 1e6)} "
        "counter drop"
        for i, j, s in _pairs(state, hosts) if s.loss > 0
    ]  # fmt: skip
    # Re-create the whole table in one transaction (rule counters cannot be reset).
    script = f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"
    script += f"table inet {NFT_TABLE} {{\n  chain wan {{\n    type filter hook forward priority -10; policy accept;\n"
    script += "".join(f"    {r}\n" for r in rules) + "  }\n}\n"
    sh(in_ns(ROUTER, ["nft", "-f", "-"]), input_text=script)


def queue_number(i: int, j: int) -> int:
    return i * 256 + j


def _delay(state: State, hosts: list[str]) -> None:
    ipt = in_ns(ROUTER, [iptables()])
    sh([*ipt, "-F", "FORWARD"])
    queues = {}
    for i, j, s in _pairs(state, hosts):
        if s.one_way_delay > 0:
            q = queue_number(i, j)
            queues[q] = s.one_way_delay
            # --queue-bypass: if the delay line is gone, packets pass undelayed (lab status says so).
            sh(
                [
                    *ipt,
                    "-A",
                    "FORWARD",
                    "-s",
                    f"198.18.{i}.0/24",
                    "-d",
                    f"198.18.{j}.0/24",
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    str(q),
                    "--queue-bypass",
                ]
            )
    _restart_delay_line(state, queues)


def _restart_delay_line(state: State, queues: dict[int, float]) -> None:
    current = [p for p in state.processes if p["what"] == "delay-line"]
    if (
        len(current) == 1
        and alive(current[0]["pid"])
        and {int(q): d for q, d in current[0]["queues"].items()} == queues
    ):
        return  # nothing changed: do not open a window without delay
    for proc in current:
        kill(proc["pid"])
        state.processes.remove(proc)
    if queues:
        cmd = in_ns(ROUTER, [sys.executable, "-m", "pathprobe_lab.delayline", "--queues", json.dumps(queues)])
        log_path = STATE_DIR / "delay-line.log"
        with log_path.open("ab") as log_file:
            child = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL, start_new_session=True
            )
        state.processes.append({"pid": child.pid, "what": "delay-line", "queues": queues})
        state.save()
        # It prints "ready" once every queue is bound; until then packets would pass undelayed.
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 10)
        line = child.stdout.readline().decode().strip() if ready else ""
        child.stdout.close()
        if line != "ready":
            raise LabError(f"the delay line did not start: {log_path.read_text()[-500:]}")
    state.save()


def ensure_delay_line(state: State) -> bool:
    """Restart the delay line if it died; True when it had to."""
    for proc in state.processes:
        if proc["what"] == "delay-line" and not alive(proc["pid"]):
            queues = {int(q): d for q, d in proc["queues"].items()}
            _restart_delay_line(state, queues)
            return True
    return False


def set_path(state: State, src: str, dst: str, spec: PathSpec) -> None:
    state.index(src), state.index(dst)  # validate names
    state.paths[f"{src}>{dst}"] = asdict(spec)
    state.save()
    apply_shaping(state)


def restore(state: State, src: str, dst: str) -> PathSpec:
    spec = resolve(state.topo())[(src, dst)]
    set_path(state, src, dst, spec)
    return spec


# --- processes and teardown ---------------------------------------------------
def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def kill(pid: int, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; waits for the process to go."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                pass
            if not alive(pid):
                return
            time.sleep(0.05)


def spawn(cmd: list[str], log: Path, what: str) -> subprocess.Popen[bytes]:
    """Start a process of the lab in its own session, output to `log`, registered so that
    `lab down` stops it even if whoever started it dies first."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    register(proc.pid, what)
    return proc


def register(pid: int, what: str) -> None:
    state = State.load()
    if state is not None:
        state.processes.append({"pid": pid, "what": what})
        state.save()


def _namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def down() -> list[str]:
    """Remove everything the lab made; safe to run at any time, any number of times."""
    done = []
    state = State.load()
    for proc in state.processes if state else []:
        kill(proc["pid"])
        done.append(f"stopped {proc['what']} (pid {proc['pid']})")
    for name in _namespaces():
        # Whatever still runs inside (exporters, iperf3) goes with its namespace.
        for pid in sh(["ip", "netns", "pids", name], check=False).stdout.split():
            kill(int(pid))
        sh(["ip", "netns", "del", name], check=False)
        done.append(f"removed namespace {name}")
    if sh(["ip", "link", "show", ROOT_LINK], check=False).returncode == 0:
        sh(["ip", "link", "del", ROOT_LINK], check=False)
        done.append(f"removed link {ROOT_LINK}")
    for key, old in (state.restore_sysctls if state else {}).items():
        sh(["sysctl", "-qw", f"{key}={old}"], check=False)
        done.append(f"restored {key} = {old}")
    if state is not None:
        State.file().unlink(missing_ok=True)
    return done


# --- status -------------------------------------------------------------------
def status() -> dict:  # type: ignore[type-arg]
    state = State.load()
    if state is None:
        return {"up": False, "namespaces_left_over": _namespaces()}
    topo = state.topo()
    present = set(_namespaces())
    hosts = [
        {"name": h.name, "region": h.region, "zone": h.zone, "address": address(i),
         "namespace": ns(h.name), "present": ns(h.name) in present}
        for i, h in enumerate(topo.hosts, start=1)
    ]  # fmt: skip
    paths = [
        {"src": k.split(">")[0], "dst": k.split(">")[1], **v, "rate_bits_per_second": v["rate"]}
        for k, v in state.paths.items()
    ]
    procs = [{**p, "alive": alive(p["pid"])} for p in state.processes]
    return {
        "up": True,
        "router_present": ROUTER in present,
        "scale": topo.scale,
        "hosts": hosts,
        "paths": paths,
        "processes": procs,
    }
