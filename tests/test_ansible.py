"""The Ansible role and playbooks: lint, syntax, argument specs, and a real deployment into
lab hosts that have their own root filesystems (one debootstrap, copied per host)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from helpers import topology, wait_for
from pathprobe import config, promql
from pathprobe_lab import demo, net
from pathprobe_lab.state import in_ns, ns, spawn
from pathprobe_lab.topology import address

ROOT = Path(__file__).parents[1]
ANSIBLE = ROOT / "ansible"
ROLE = ANSIBLE / "roles" / "pathprobe"
BIN = Path(sys.executable).parent
ROOTFS = Path("/var/tmp/pathprobe-rootfs")
MIRROR = "http://deb.debian.org/debian"
PROM_PORT = 19290


def run(cmd: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=ANSIBLE, **kw)  # type: ignore[call-overload, no-any-return]


def test_ansible_lint_production_profile() -> None:
    proc = run([str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", "--format=pep8"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_syntax_check() -> None:
    proc = run([str(BIN / "ansible-playbook"), "--syntax-check", "playbooks/site.yml", "playbooks/monitoring.yml"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_argument_specs_list_exactly_the_defaults() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults)
    assert all(name.startswith("pathprobe_") for name in defaults)
    for name, spec in specs.items():
        assert spec["description"], name


# --- one source for every default: the role passes the exporter's settings through ------
PASS_THROUGH = ["pathprobe_probes", "pathprobe_schedule", "pathprobe_budget", "pathprobe_responders",
                "pathprobe_iperf3"]  # fmt: skip


def render_role_config(tmp_path: Path, extra: dict) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The role's config template for host a of a two-host mesh, with the role's defaults and
    `extra` as extra vars, checked by `pathprobe check-config` as the role does."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    out = tmp_path / "pathprobe.yaml"
    inventory = {"all": {"vars": defaults, "children": {"pathprobe": {"hosts": {
        "a": {"pathprobe_region": "r1", "pathprobe_address": "127.0.0.1", "ansible_connection": "local",
              "ansible_python_interpreter": sys.executable},
        "b": {"pathprobe_region": "r2", "pathprobe_address": "127.0.0.2"},
    }}}}}  # fmt: skip
    play = [{"name": "Render the role's config", "hosts": "a", "gather_facts": False, "tasks": [
        {"name": "Template", "ansible.builtin.template": {
            "src": str(ROLE / "templates" / "pathprobe.yaml.j2"), "dest": str(out), "mode": "0644",
            "validate": f"{BIN / 'pathprobe'} check-config %s"}}]}]  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                "-e", json.dumps(extra)],
               env={"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
                    "ANSIBLE_NOCOLOR": "1", "HOME": str(tmp_path)})  # fmt: skip
    return proc, out


def test_the_role_writes_no_exporter_default(tmp_path: Path) -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert {name: defaults[name] for name in PASS_THROUGH} == {name: {} for name in PASS_THROUGH}
    proc, out = render_role_config(tmp_path, {})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    written = yaml.safe_load(out.read_text())
    # Only what the role owns: the host, its peers, where /metrics listens, where state goes.
    assert set(written) == {"host", "peers", "web", "budget"}, written
    assert written["budget"] == {"state_file": "/var/lib/pathprobe/budget.json"}
    peer_keys = {"name", "address", "region", "zone", "instance_type", "path_class"}
    assert [p["name"] for p in written["peers"]] == ["b"] and set(written["peers"][0]) <= peer_keys
    cfg = config.load(out)
    model = config.Config(host=cfg.host, peers=cfg.peers)  # every section at the models' defaults
    for section in ("probes", "schedule", "responders", "iperf3"):
        assert getattr(cfg, section) == getattr(model, section), section
    assert cfg.budget.daily_bytes == model.budget.daily_bytes
    # The monitoring play's file_sd falls back to the role's listen address.
    file_sd = (ANSIBLE / "playbooks" / "templates" / "file_sd.json.j2").read_text()
    assert f"default('{defaults['pathprobe_web_listen']}')" in file_sd


def test_the_role_passes_what_the_user_sets_through(tmp_path: Path) -> None:
    settings = {"pathprobe_probes": {"rtt": {"interval_seconds": 0.25}, "loss": {"enabled": False}},
                "pathprobe_schedule": {"slot_seconds": 300}, "pathprobe_budget": {"daily_bytes": "20GB"},
                "pathprobe_responders": {"rr_port": 19470}, "pathprobe_iperf3": {"port": 15201}}  # fmt: skip
    proc, out = render_role_config(tmp_path, settings)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    written = yaml.safe_load(out.read_text())
    for name, values in settings.items():
        section = name.removeprefix("pathprobe_")
        extra = {"state_file": "/var/lib/pathprobe/budget.json"} if section == "budget" else {}
        assert written[section] == values | extra, section
    cfg = config.load(out)
    assert cfg.probes.rtt.interval_seconds == 0.25 and not cfg.probes.loss.enabled
    assert cfg.probes.rtt.size_bytes == config.default(config.RttSettings, "size_bytes")  # the rest: defaults
    set_values = (cfg.schedule.slot_seconds, cfg.budget.daily_bytes, cfg.responders.rr_port, cfg.iperf3.port)
    assert set_values == (300, 20 * 10**9, 19470, 15201)


# --- a real deployment -----------------------------------------------------------------
TOPOLOGY = topology("""
hosts:
  - {name: dep-tokyo, region: ap-northeast-1, zone: ap-northeast-1a}
  - {name: dep-osaka, region: ap-northeast-3, zone: ap-northeast-3a}
  - {name: dep-singapore, region: ap-southeast-1, zone: ap-southeast-1a}
paths:
  - {between: [ap-northeast-1, ap-northeast-3], rate: 300M, one_way_delay: 4ms}
  - {between: [ap-northeast-1, ap-southeast-1], rate: 300M, one_way_delay: 10ms}
  - {between: [ap-northeast-3, ap-southeast-1], rate: 300M, one_way_delay: 10ms}
""")


def base_rootfs() -> Path:
    """Debian 12 with Python, as a cloud image has it; made once and kept between runs."""
    base = ROOTFS / "base"
    if not (base / "usr" / "bin" / "python3").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        cmd = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", str(base), MIRROR]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return base


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("ansible")
    base = base_rootfs()
    roots = {}
    for h in TOPOLOGY.hosts:
        root = ROOTFS / h.name
        subprocess.run(["umount", "-l", str(root / "proc")], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["cp", "-a", str(base), str(root)], check=True)
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")  # as cloud-init would
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
        roots[h.name] = root
    net.up(TOPOLOGY)
    hosts = {
        h.name: {"ansible_host": str(roots[h.name]), "pathprobe_address": address(i), "pathprobe_region": h.region,
                 "pathprobe_zone": h.zone}
        for i, h in enumerate(TOPOLOGY.hosts, start=1)
    }  # fmt: skip
    inventory = {"all": {"children": {
        "pathprobe": {"hosts": hosts, "vars": {
            "ansible_connection": "community.general.chroot", "ansible_become": False,
            "ansible_python_interpreter": "/usr/bin/python3",
            # No systemd in a chroot: install and configure; the test starts the exporters.
            "pathprobe_service_manage": False,
            "pathprobe_iperf3_auth": True,
            "pathprobe_iperf3_keys_dir": str(work / "keys"),
            "pathprobe_wheel_dir": str(work / "wheels"),
            "pathprobe_probes": {"throughput": {"streams": [1], "duration_seconds": 2, "omit_seconds": 1},
                                 "rtt": {"interval_seconds": 0.1}, "loss": {"rate_pps": 10}},
            "pathprobe_schedule": {"slot_seconds": 16, "jitter_seconds": 1, "timeout_margin_seconds": 3},
        }},
        "monitoring": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_become": False,
                                               "ansible_python_interpreter": sys.executable}}},
    }}}  # fmt: skip
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    file_sd = work / "file_sd" / "pathprobe.json"
    # monitoring_install_rules as JSON: a boolean, not the string "false".
    cmd = [str(BIN / "ansible-playbook"), "-i", str(work / "hosts.yml"), "playbooks/site.yml",
           "playbooks/monitoring.yml", "-e", f"monitoring_file_sd_path={file_sd}",
           "-e", '{"monitoring_install_rules": false}']  # fmt: skip
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "HOME": str(work)}  # fmt: skip
    first = run(cmd, timeout=1200, env=env)
    second = run(cmd, timeout=1200, env=env) if first.returncode == 0 else first
    yield {"work": work, "roots": roots, "first": first, "second": second, "file_sd": file_sd}
    net.down()
    for root in roots.values():
        subprocess.run(["umount", "-l", str(root / "proc")], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def recap(output: str) -> dict[str, dict[str, int]]:
    found = {}
    for host, stats in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stats)}
    return found


def test_deploys_then_changes_nothing_on_a_second_run(deployed: dict) -> None:
    first, second = deployed["first"], deployed["second"]
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    stats = recap(second.stdout)
    assert set(stats) >= {h.name for h in TOPOLOGY.hosts} | {"localhost"}
    changed = [line for line in second.stdout.splitlines() if line.startswith(("changed:", "TASK ["))]
    assert all(s["changed"] == 0 and s["failed"] == 0 for s in stats.values()), (stats, changed)
    for root in deployed["roots"].values():
        cfg = yaml.safe_load((root / "etc" / "pathprobe" / "pathprobe.yaml").read_text())
        assert len(cfg["peers"]) == 2 and cfg["iperf3"]["auth"]["username"] == "pathprobe"
        # Only what the inventory set is written; the exporter's defaults apply to the rest.
        assert cfg["probes"]["rtt"] == {"interval_seconds": 0.1} and "responders" not in cfg
        assert cfg["budget"] == {"state_file": "/var/lib/pathprobe/budget.json"}
        assert (root / "etc" / "systemd" / "system" / "pathprobe.service").exists()
    targets = json.loads(deployed["file_sd"].read_text())
    assert {t["labels"]["host"] for t in targets} == {h.name for h in TOPOLOGY.hosts}
    assert all(t["labels"]["region"] and t["labels"]["zone"] for t in targets)


def test_deployed_unit_is_valid_and_hardened(deployed: dict) -> None:
    unit = next(iter(deployed["roots"].values())) / "etc" / "systemd" / "system" / "pathprobe.service"
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    # The commands it names are in the host's root filesystem, not on this machine.
    problems = [line for line in verify.stderr.splitlines() if line.strip() and "is not executable" not in line]
    assert problems == [], verify.stderr
    # Exposure on systemd's 0-10 scale ("1.3 OK"); --threshold takes tenths.
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=15", str(unit)],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert security.returncode == 0, security.stdout[-3000:] + security.stderr
    # The firewall (tests/test_firewall.py) is applied as root before the sandboxed exporter starts.
    text = unit.read_text()
    assert "ExecStartPre=+" in text and "pathprobe firewall --config" in text and "--remove" in text


def test_deployed_exporters_probe_each_other(deployed: dict) -> None:
    work, roots = deployed["work"], deployed["roots"]
    assert deployed["second"].returncode == 0
    for name, root in roots.items():
        # Started from the deployed files, as the unit would: the installed venv, the written config, its user.
        cmd = in_ns(ns(name), ["chroot", "--userspec=pathprobe:pathprobe", str(root),
                                       "/opt/pathprobe/venv/bin/pathprobe", "run", "--config",
                                       "/etc/pathprobe/pathprobe.yaml"])  # fmt: skip
        spawn(cmd, work / f"{name}.log", f"deployed exporter {name}")
    prom_cfg = {
        "global": {"scrape_interval": "5s"},
        "scrape_configs": [{"job_name": "pathprobe", "file_sd_configs": [{"files": [str(deployed["file_sd"])]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    spawn([demo.binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
               f"--storage.tsdb.path={work / 'prom-data'}", f"--web.listen-address=127.0.0.1:{PROM_PORT}"],
              work / "prometheus.log", "prometheus (ansible test)")  # fmt: skip
    url = f"http://127.0.0.1:{PROM_PORT}"
    demo.wait_ready(f"{url}/-/ready", "Prometheus")
    names = [h.name for h in TOPOLOGY.hosts]
    paths = {(a, b) for a in names for b in names if a != b}

    def measured(metric: str) -> set[tuple[str, str]]:
        return {(s["metric"]["host"], s["metric"]["peer"]) for s in promql.query(url, metric)}

    wait_for("RTT for every path", lambda: measured("pathprobe_rtt_seconds_count") >= paths, timeout=90)
    # Throughput through iperf3 with the RSA keys the play generated and distributed.
    wait_for("throughput for every path", lambda: measured("pathprobe_throughput_bytes_per_second") >= paths,
             timeout=180)  # fmt: skip


def test_the_monitoring_play_renders_the_rules_with_the_fleets_parameters(tmp_path: Path) -> None:
    inventory = {"all": {"children": {
        "pathprobe": {"hosts": {"a": {"pathprobe_region": "r1", "ansible_host": "198.18.1.2"}}},
        "monitoring": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_become": False,
                                               "ansible_python_interpreter": sys.executable}}},
    }}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    scratch = tmp_path / "scratch"  # the controller's TMPDIR: the play's work directory goes there
    scratch.mkdir()

    def play(params: dict) -> subprocess.CompletedProcess[str]:
        extra = {"monitoring_alert_params": params,
                 "monitoring_file_sd_path": str(tmp_path / "file_sd" / "pathprobe.json"),
                 "monitoring_rules_dir": str(tmp_path / "rules"),
                 "monitoring_alertmanager_config": str(tmp_path / "alertmanager.yml")}  # fmt: skip
        return run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), "playbooks/monitoring.yml",
                    "-e", json.dumps(extra)],
                   env={"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_NOCOLOR": "1",
                        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "HOME": str(tmp_path),
                        "TMPDIR": str(scratch)})  # fmt: skip

    proc = play({"selector": 'job="netprobe"', "loss_ratio_warning": 0.02})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rules = (tmp_path / "rules" / "pathprobe.rules.yml").read_text()
    assert 'pathprobe_udp_packets_lost_total{job="netprobe"}' in rules and "> 0.02" in rules
    assert 'job="pathprobe"' not in rules
    assert not list(scratch.glob("*.pathprobe-rules")), "the work directory stayed"
    # A bad parameter stops the play, names the field, leaves the installed rules and no work directory.
    proc = play({"no_such_param": 1})
    assert proc.returncode != 0 and "no_such_param" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert (tmp_path / "rules" / "pathprobe.rules.yml").read_text() == rules
    assert not list(scratch.glob("*.pathprobe-rules")), "the work directory stayed"
    # No parameters: the parameters' defaults, i.e. the committed rules.
    proc = play({})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    committed = (ROOT / "alerts" / "pathprobe.rules.yml").read_text()
    assert (tmp_path / "rules" / "pathprobe.rules.yml").read_text() == committed
