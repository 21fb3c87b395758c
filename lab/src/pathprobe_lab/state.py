"""The lab's state and names: what `lab up` made (a JSON file, so that `lab down` can
remove it from any process), the namespaces' names, running commands in them, and the
registry of the lab's processes."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pathprobe.files import write_atomic

from .topology import PathSpec, Topology

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
    # The cgroups that hold some hosts' iperf3 to a CPU quota (cpu.py).
    cgroups: list[str] = field(default_factory=list)

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
        write_atomic(self.file(), json.dumps(asdict(self), indent=1))

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
