"""Building and tearing down the lab: network namespaces (one per host) joined by a router
namespace, the root namespace's route to them, per-host TCP settings; and its status.

This drives iproute2, nft and iptables rather than netlink directly (pyroute2):
the lab is something people rehearse with and debug by hand, and `--verbose`
prints the very commands they can re-run. Everything the lab makes is either
inside its namespaces (gone with them) or recorded in the state file by PID.
"""

from __future__ import annotations

from dataclasses import asdict

from pathprobe import procs

from . import caps, cpu
from .shaping import apply_shaping
from .state import PREFIX, ROOT_LINK, ROUTER, LabError, State, in_ns, ns, require_tools, sh
from .topology import Topology, address, resolve


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
        caps.apply(topo)
        cpu.apply(topo, state)
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


# --- down and status ----------------------------------------------------------
def _namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def down() -> list[str]:
    """Remove everything the lab made; safe to run at any time, any number of times."""
    done = []
    state = State.load()
    for proc in state.processes if state else []:
        procs.terminate(proc["pid"])
        done.append(f"stopped {proc['what']} (pid {proc['pid']})")
    for name in _namespaces():
        # Whatever still runs inside (exporters, iperf3) goes with its namespace.
        for pid in sh(["ip", "netns", "pids", name], check=False).stdout.split():
            procs.terminate(int(pid))
        sh(["ip", "netns", "del", name], check=False)
        done.append(f"removed namespace {name}")
    if sh(["ip", "link", "show", ROOT_LINK], check=False).returncode == 0:
        sh(["ip", "link", "del", ROOT_LINK], check=False)
        done.append(f"removed link {ROOT_LINK}")
    done += cpu.remove(state)
    for key, old in (state.restore_sysctls if state else {}).items():
        sh(["sysctl", "-qw", f"{key}={old}"], check=False)
        done.append(f"restored {key} = {old}")
    if state is not None:
        State.file().unlink(missing_ok=True)
    return done


def status() -> dict:  # type: ignore[type-arg]
    state = State.load()
    if state is None:
        return {"up": False, "namespaces_left_over": _namespaces()}
    topo = state.topo()
    present = set(_namespaces())
    hosts = [
        {
            "name": h.name,
            "region": h.region,
            "zone": h.zone,
            "address": address(i),
            "namespace": ns(h.name),
            "present": ns(h.name) in present,
            "instance_type": h.instance_type,
            "caps": caps.status(topo, h) if ns(h.name) in present else None,
        }
        for i, h in enumerate(topo.hosts, start=1)
    ]
    paths = [
        {"src": k.split(">")[0], "dst": k.split(">")[1], **v, "rate_bits_per_second": v["rate"]}
        for k, v in state.paths.items()
    ]
    processes = [{**p, "alive": procs.alive(p["pid"])} for p in state.processes]
    return {
        "up": True,
        "router_present": ROUTER in present,
        "scale": topo.scale,
        "hosts": hosts,
        "paths": paths,
        "processes": processes,
    }
