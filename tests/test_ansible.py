"""The Ansible role and playbooks: lint, syntax, argument specs, and a real deployment over
SSH onto lab hosts that boot systemd from their own root filesystems (one debootstrap,
copied per host, booted with systemd-nspawn inside the host's lab namespace)."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from helpers import topology, wait_for
from pathprobe import config, probe_settings, procs, promql, strict
from pathprobe.exporter import RESTART_ONLY
from pathprobe_lab import demo, net
from pathprobe_lab.state import ns, spawn
from pathprobe_lab.topology import address
from releases import Release, pip_settings, release
from rootfs import ROOTFS, rootfs

ROOT = Path(__file__).parents[1]
ANSIBLE = ROOT / "ansible"
COLLECTION = ANSIBLE / "collections" / "ansible_collections" / "pathprobe" / "pathprobe"
ROLE = COLLECTION / "roles" / "pathprobe"
FQCN = "pathprobe.pathprobe.pathprobe"
BIN = Path(sys.executable).parent
PROM_PORT = 19290


def run(cmd: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=ANSIBLE, **kw)  # type: ignore[call-overload, no-any-return]


def playbook(
    inventory: Path, *args: str, home: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook over `inventory` with `args` (plays, options) from ansible/, as the tests' one
    controller: the venv's Ansible on PATH, the repository's ansible.cfg, `home` as HOME, this
    environment's pip settings (its pip builds and downloads wheels), and `env` beside."""
    base = {
        "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "HOME": str(home),
    } | pip_settings()
    return run([str(BIN / "ansible-playbook"), "-i", str(inventory), *args], timeout=timeout, env=base | (env or {}))


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
PASS_THROUGH = [
    "pathprobe_probes",
    "pathprobe_mesh",
    "pathprobe_schedule",
    "pathprobe_budget",
    "pathprobe_responders",
    "pathprobe_iperf3",
]


def role_vars() -> dict:
    """The role's defaults and its own vars (what templates rendered outside the role need)."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return defaults | yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def local_play(tmp_path: Path, inventory: dict, play: list[dict], extra: dict) -> subprocess.CompletedProcess[str]:
    """ansible-playbook of `play` over `inventory` (written in tmp_path) with `extra` vars."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return playbook(tmp_path / "hosts.yml", str(tmp_path / "play.yml"), "-e", json.dumps(extra), home=tmp_path)


def render_role_config(tmp_path: Path, extra: dict) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The role's config template for host a of a two-host mesh, with the role's defaults and
    `extra` as extra vars, checked by `pathprobe check-config` as the role does."""
    # iperf3 authentication (on by default) names key files this machine lacks, which
    # check-config refuses: the deployment below covers it.
    extra = {"pathprobe_iperf3_auth": False, **extra}
    out = tmp_path / "pathprobe.yaml"
    inventory = {
        "all": {
            "vars": role_vars(),
            "children": {
                "pathprobe": {
                    "hosts": {
                        "a": {
                            "pathprobe_region": "r1",
                            "pathprobe_address": "127.0.0.1",
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                        },
                        "b": {"pathprobe_region": "r2", "pathprobe_address": "127.0.0.2"},
                    }
                }
            },
        }
    }
    play = [
        {
            "name": "Render the role's config",
            "hosts": "a",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Template",
                    "ansible.builtin.template": {
                        "src": str(ROLE / "templates" / "pathprobe.yaml.j2"),
                        "dest": str(out),
                        "mode": "0644",
                        "validate": f"{BIN / 'pathprobe'} check-config %s",
                    },
                }
            ],
        }
    ]
    proc = local_play(tmp_path, inventory, play, extra)
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
    peer_keys = {"name", "address", "region", "zone", "instance_type", "transit_gateway_attachment", "path_class"}
    assert [p["name"] for p in written["peers"]] == ["b"] and set(written["peers"][0]) <= peer_keys
    cfg = config.load(out)
    model = config.Config(host=cfg.host, peers=cfg.peers)  # every section at the models' defaults
    for section in ("probes", "mesh", "schedule", "responders", "iperf3"):
        assert getattr(cfg, section) == getattr(model, section), section
    assert cfg.budget.daily_bytes == model.budget.daily_bytes
    # The monitoring play's file_sd falls back to the role's listen address.
    file_sd = (ANSIBLE / "playbooks" / "templates" / "file_sd.json.j2").read_text()
    assert f"default('{defaults['pathprobe_web_listen']}')" in file_sd


def test_the_role_passes_what_the_user_sets_through(tmp_path: Path) -> None:
    settings = {
        "pathprobe_probes": {"rtt": {"interval_seconds": 0.25}, "loss": {"enabled": False}},
        "pathprobe_schedule": {"slot_seconds": 300},
        "pathprobe_budget": {"daily_bytes": "20GB"},
        "pathprobe_responders": {"rr_port": 19470},
        "pathprobe_iperf3": {"port": 15201},
        "pathprobe_mesh": {"throughput": {"kind": "hierarchical", "representatives": 1}},
    }
    proc, out = render_role_config(tmp_path, settings)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    written = yaml.safe_load(out.read_text())
    for name, values in settings.items():
        section = name.removeprefix("pathprobe_")
        extra = {"state_file": "/var/lib/pathprobe/budget.json"} if section == "budget" else {}
        assert written[section] == values | extra, section
    cfg = config.load(out)
    assert cfg.probes.rtt.interval_seconds == 0.25 and not cfg.probes.loss.enabled
    assert cfg.probes.rtt.size_bytes == strict.default(probe_settings.RttSettings, "size_bytes")  # the rest: defaults
    set_values = (cfg.schedule.slot_seconds, cfg.budget.daily_bytes, cfg.responders.rr_port, cfg.iperf3.port)
    assert set_values == (300, 20 * 10**9, 19470, 15201)
    assert cfg.mesh.throughput is not None and cfg.mesh.throughput.kind == "hierarchical"


def render_config_change(tmp_path: Path, members: list[str], extra: dict) -> tuple[dict, bool]:
    """The role's config_change.yml and config template for host a of a mesh of `members`, with
    the config written in tmp_path by the previous call as the running one: (config, restart?)."""
    defaults = role_vars()
    hosts = {
        m: {"pathprobe_region": f"r{i % 2}", "pathprobe_address": f"127.0.0.{i + 1}"} for i, m in enumerate(members)
    }
    hosts["a"] |= {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": defaults | {"pathprobe_iperf3_auth": False, "pathprobe_config_dir": str(tmp_path)},
            "children": {"pathprobe": {"hosts": hosts}},
        }
    }
    play = [
        {
            "name": "Render",
            "hosts": "a",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Compare",
                    "ansible.builtin.include_role": {"name": FQCN, "tasks_from": "config_change"},
                },
                {
                    "name": "Template",
                    "ansible.builtin.template": {
                        "src": str(ROLE / "templates" / "pathprobe.yaml.j2"),
                        "dest": str(tmp_path / "pathprobe.yaml"),
                        "mode": "0644",
                        "validate": f"{BIN / 'pathprobe'} check-config %s",
                    },
                },
                {
                    "name": "Note",
                    "ansible.builtin.copy": {
                        "content": "{{ pathprobe_config_needs_restart }}",
                        "dest": str(tmp_path / "restart"),
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    proc = local_play(tmp_path, inventory, play, extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return yaml.safe_load((tmp_path / "pathprobe.yaml").read_text()), (tmp_path / "restart").read_text() == "True"


def test_the_web_config_file_hashes_passwords_on_the_controller_and_checks(tmp_path: Path) -> None:
    """The role's web config template, as the prometheus-community roles write node_exporter's:
    a password hashed with bcrypt (the same hash on the next run), a hash passed through, the
    certificate files and a client CA, checked by `pathprobe check-web-config` before it lands."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "web-cert.pem", tmp_path / "web-key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=a",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copy(cert, tmp_path / "web-client-ca.pem")
    hashed = bcrypt.hashpw(b"ops-password", bcrypt.gensalt(4)).decode()
    out = tmp_path / "web-config.yml"
    inventory = {
        "all": {
            "vars": role_vars() | {"pathprobe_config_dir": str(tmp_path)},
            "hosts": {"a": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
        }
    }
    play = [
        {
            "name": "Render the web config",
            "hosts": "a",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Template",
                    "ansible.builtin.template": {
                        "src": str(ROLE / "templates" / "web-config.yml.j2"),
                        "dest": str(out),
                        "mode": "0644",
                        "validate": f"{BIN / 'pathprobe'} check-web-config %s",
                    },
                }
            ],
        }
    ]
    extra = {
        "pathprobe_web_tls_cert": cert.read_text(),
        "pathprobe_web_tls_key": key.read_text(),
        "pathprobe_web_tls_client_ca": cert.read_text(),
        "pathprobe_web_config_tls_server_config": {"min_version": "TLS13"},
        "pathprobe_web_config_basic_auth_users": {"prom": "s3cret", "ops": hashed},
    }
    proc = local_play(tmp_path, inventory, play, extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    first = out.read_text()
    web = yaml.safe_load(first)
    assert web["tls_server_config"] == {
        "cert_file": str(cert),
        "key_file": str(key),
        "client_ca_file": str(tmp_path / "web-client-ca.pem"),
        "client_auth_type": "RequireAndVerifyClientCert",
        "min_version": "TLS13",
    }
    assert web["basic_auth_users"]["ops"] == hashed
    assert bcrypt.checkpw(b"s3cret", web["basic_auth_users"]["prom"].encode())
    proc = local_play(tmp_path, inventory, play, extra)
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-3000:]
    assert out.read_text() == first
    # A bad value stops the play with check-web-config's file:line, and the file in place stays.
    extra["pathprobe_web_config_tls_server_config"] = {
        "cert_file": str(cert),
        "key_file": str(key),
        "client_auth_type": "RequireAnyClientCert",
    }
    proc = local_play(tmp_path, inventory, play, extra)
    assert proc.returncode != 0 and "RequireAnyClientCert (any certificate, none verified)" in proc.stdout
    assert out.read_text() == first


def test_the_role_restarts_for_exactly_what_a_reload_cannot_apply() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "config_change.yml").read_text())
    decide = next(t for t in tasks if "pathprobe_config_needs_restart" in t.get("ansible.builtin.set_fact", {}))
    assert tuple(decide["vars"]["restart_only"]) == RESTART_ONLY


def test_a_member_list_change_gets_one_epoch_and_a_reload(tmp_path: Path) -> None:
    first, restart = render_config_change(tmp_path, ["a", "b"], {})
    assert "mesh" not in first and restart  # a new mesh: no epoch; nothing runs yet: a (first) start
    again, restart = render_config_change(tmp_path, ["a", "b"], {"pathprobe_probes": {"rtt": {"flows": 4}}})
    assert "mesh" not in again and not restart  # same members, a probe setting: a reload
    started = time.time()
    grown, restart = render_config_change(tmp_path, ["a", "b", "c"], {})
    epoch = float(grown["mesh"]["epoch"])
    assert started + 290 <= epoch <= time.time() + 310 and not restart  # takes effect in 300 s, by a reload
    kept, _ = render_config_change(tmp_path, ["a", "b", "c"], {})
    assert float(kept["mesh"]["epoch"]) == epoch  # the same members again: the same file
    _, restart = render_config_change(tmp_path, ["a", "b", "c"], {"pathprobe_budget": {"daily_bytes": "40GB"}})
    assert restart
    # An epoch set for later batches: hours ahead (more than a day ahead, check-config warns of it).
    at = int(time.time()) + 3 * 3600
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    render_config_change(tmp_path, ["a", "c"], {"pathprobe_mesh_epoch": later})
    assert config.load(tmp_path / "pathprobe.yaml").mesh.epoch == datetime.fromtimestamp(at, UTC)


def test_preflight_refuses_a_host_without_systemd(tmp_path: Path) -> None:
    # This machine's PID 1 is not systemd: the role must stop before installing anything.
    inventory = {
        "all": {
            "children": {
                "pathprobe": {
                    "hosts": {
                        "a": {
                            "pathprobe_region": "r1",
                            "pathprobe_address": "127.0.0.1",
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                        },
                        "b": {"pathprobe_region": "r2", "pathprobe_address": "127.0.0.2"},
                    }
                }
            }
        }
    }
    play = [
        {
            "name": "Preflight",
            "hosts": "a",
            "tasks": [
                {
                    "name": "The role's preflight",
                    "ansible.builtin.include_role": {"name": FQCN, "tasks_from": "preflight"},
                }
            ],
        }
    ]
    proc = local_play(tmp_path, inventory, play, {})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "pathprobe_service_manage is true but this host's service manager is" in proc.stdout, proc.stdout[-3000:]
    # Opting out is what the message says: the same preflight then asks what to install, and passes.
    proc = local_play(tmp_path, inventory, play, {"pathprobe_service_manage": False})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "a: set pathprobe_release_wheel (a release's wheel, a path or a URL" in " ".join(proc.stdout.split())
    proc = local_play(tmp_path, inventory, play, {"pathprobe_service_manage": False, "pathprobe_source_dir": "/src"})
    assert proc.returncode == 0, proc.stdout[-3000:]


PYENV = Path.home() / ".pyenv" / "versions"
WHEELS_TASKS = {"name": FQCN, "tasks_from": "wheels"}
EXAMPLE_CONFIG = ROOT / "exporter" / "examples" / "pathprobe.yaml"


def pyenv_python(minor: str) -> str:
    """The pyenv interpreter of Python `minor` (e.g. "3.12"), as this machine has them."""
    found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
    assert found, f"no Python {minor} under {PYENV} (pyenv install {minor})"
    return str(found[-1])


def wheels_play(
    tmp_path: Path, hosts: dict[str, dict], extra: dict, arm: bool = False, install: bool = False
) -> subprocess.CompletedProcess[str]:
    """The role's wheel tasks on local hosts (each with its own pathprobe_python), with `install` its
    virtualenv tasks after them; with `arm`, a second play has the controller download an aarch64
    wheelhouse for a host that names it."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {**{h: {**local, **v} for h, v in hosts.items()}, "arm": local}}}
    tasks = [{"name": "The role's wheels", "ansible.builtin.include_role": WHEELS_TASKS}]
    if install:
        venv = {"name": FQCN, "tasks_from": "venv"}
        tasks.append({"name": "The role's virtualenv of the build", "ansible.builtin.include_role": venv})
    play = [{"name": "Wheels", "hosts": ",".join(hosts), "gather_facts": True, "tasks": tasks}]
    if arm:
        play.append(
            {
                "name": "An aarch64 host's wheelhouse",
                "hosts": "arm",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": "A Graviton host with Python 3.11",
                        "ansible.builtin.set_fact": {"pathprobe_wheelhouse": "aarch64-py3.11"},
                    },
                    {
                        "name": "The role's wheelhouses",
                        "ansible.builtin.include_role": {"name": FQCN, "tasks_from": "wheelhouses"},
                    },
                ],
            }
        )
    return local_play(
        tmp_path,
        inventory,
        play,
        {
            "pathprobe_wheel_dir": str(tmp_path / "wheels"),
            "pathprobe_source_dir": str(ROOT / "exporter"),
            "pathprobe_service_manage": False,
            **extra,
        },
    )


def wheelhouses(wheels: Path) -> dict[str, Path]:
    """The controller's wheelhouses (ARCH-pyX.Y-VERSION-KEY) by their ARCH-pyX.Y."""
    found = [p for p in wheels.iterdir() if p.is_dir() and p.name != "releases" and not p.name.startswith("source-")]
    return {p.name.rsplit("-", 2)[0]: p for p in found}


@pytest.mark.heavy
def test_each_host_gets_a_wheelhouse_of_its_architecture_and_python_that_installs(tmp_path: Path) -> None:
    hosts = {
        f"py{m.replace('.', '')}": {
            "pathprobe_python": pyenv_python(m),
            "pathprobe_install_dir": str(tmp_path / f"opt-py{m}"),
        }
        for m in ("3.11", "3.12", "3.13")
    }
    # py312 has a virtualenv where the link goes, as the role's first releases made it: replaced.
    legacy = Path(hosts["py312"]["pathprobe_install_dir"]) / "venv"
    run([pyenv_python("3.11"), "-m", "venv", "--without-pip", str(legacy)]).check_returncode()
    proc = wheels_play(tmp_path, hosts, {}, arm=True, install=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    houses = wheelhouses(tmp_path / "wheels")
    assert sorted(houses) == ["aarch64-py3.11", "x86_64-py3.11", "x86_64-py3.12", "x86_64-py3.13"]
    built = next((tmp_path / "wheels").glob("source-*/pathprobe-*.whl"))
    version = built.name.split("-")[1]
    for host, v in hosts.items():
        # Its own Python's virtualenv, from its wheelhouse alone, behind the link the unit starts.
        minor = f"{host[2]}.{host[3:]}"
        link = Path(v["pathprobe_install_dir"]) / "venv"
        assert link.is_symlink() and re.fullmatch(
            rf"venvs/{re.escape(version)}-[0-9a-f]{{12}}-py{minor}", str(link.readlink())
        )
        said = run([str(link / "bin" / "pathprobe"), "--version"])
        assert said.stdout.startswith(f"pathprobe {version} (revision "), said.stdout + said.stderr
        assert f"Python {minor}." in said.stdout
        # Its compiled dependencies load: a config is parsed (PyYAML's C loader, pydantic-core).
        checked = run([str(link / "bin" / "pathprobe"), "check-config", str(EXAMPLE_CONFIG)])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    again = wheels_play(tmp_path, hosts, {}, install=True)
    assert again.returncode == 0 and all(s["changed"] == 0 for s in recap(again.stdout).values()), again.stdout[-3000:]
    # No aarch64 Python here to install into: pip resolves the wheelhouse for that platform alone.
    arm = houses["aarch64-py3.11"]
    assert {w.name.split("-")[0].lower() for w in arm.glob("*aarch64*.whl")} >= {"bcrypt", "pydantic_core", "pyyaml"}
    dry = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--find-links",
            str(arm),
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_aarch64",
            "--python-version",
            "3.11",
            "--target",
            str(tmp_path / "arm-target"),
            f"pathprobe=={version}",
        ]
    )
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]


def test_a_host_without_wheels_is_named_before_any_wheel_is_downloaded(tmp_path: Path) -> None:
    too_old = wheels_play(tmp_path, {"old": {"pathprobe_python": pyenv_python("3.10")}}, {})
    assert too_old.returncode != 0
    assert "old: pathprobe installs on x86_64 and aarch64 with Python 3.11 or later; this host is x86_64 and its" in (
        " ".join(too_old.stdout.split())
    ), too_old.stdout[-3000:]
    arm_only = wheels_play(
        tmp_path,
        {"x86": {"pathprobe_python": pyenv_python("3.11")}},
        {"pathprobe_wheel_platforms": {"aarch64": "manylinux2014_aarch64"}},
    )
    assert arm_only.returncode != 0
    assert "x86: pathprobe installs on aarch64 with Python 3.11 or later; this host is x86_64" in (
        " ".join(arm_only.stdout.split())
    ), arm_only.stdout[-3000:]
    assert not (tmp_path / "wheels").exists()  # nothing downloaded


def artifact_play(tmp_path: Path, extra: dict) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """The role's artifact tasks on the controller alone (the exporter's wheel: a release's, checked
    against its SHA256SUMS, or a source tree's, built): the play and the wheel, version and key noted."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    noted = tmp_path / "artifact.json"  # the same content again: no change
    play = [
        {
            "name": "The exporter's wheel",
            "hosts": "controller",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "The role's artifact",
                    "ansible.builtin.include_role": {"name": FQCN, "tasks_from": "artifact"},
                },
                {
                    "name": "Note it",
                    "ansible.builtin.copy": {
                        "content": "{{ {'wheel': pathprobe_exporter_wheel, 'version': pathprobe_exporter_version,"
                        " 'key': pathprobe_exporter_key} | to_json }}",
                        "dest": str(noted),
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    inventory = {"all": {"hosts": {"controller": local}}}
    proc = local_play(tmp_path, inventory, play, {"pathprobe_wheel_dir": str(tmp_path / "wheels"), **extra})
    return proc, json.loads(noted.read_text()) if proc.returncode == 0 else {}


def task_result(output: str, task: str) -> str:
    """What the role's `task` said first in a play's output: ok, changed, skipping, fatal."""
    found = re.search(rf"^TASK \[{FQCN} : {re.escape(task)}\][^\n]*\n(\w+)", output, re.M)
    assert found, f"no task {task!r} in:\n{output[-3000:]}"
    return found.group(1)


def wheel_file(wheel: str | Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as whl:
        return whl.read(name).decode()


def test_a_source_tree_is_built_once_per_content(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(ROOT), str(clone)]).check_returncode()
    source = {"pathprobe_source_dir": str(clone / "exporter")}
    proc, first = artifact_play(tmp_path, source)
    assert proc.returncode == 0, proc.stdout[-3000:]
    head = run(["git", "-C", str(clone), "rev-parse", "HEAD"]).stdout.strip()
    stamp = wheel_file(first["wheel"], "pathprobe/_version.py")
    assert f"VERSION = '{first['version']}'" in stamp and f"NODE = 'g{head}'" in stamp and "DIRTY = False" in stamp
    assert first["key"] == hashlib.sha256(Path(first["wheel"]).read_bytes()).hexdigest()[:12]
    assert task_result(proc.stdout, "Build the wheel of this content") == "changed"
    # The same tree again: not built again.
    proc, again = artifact_play(tmp_path, source)
    assert proc.returncode == 0 and recap(proc.stdout)["controller"]["changed"] == 0, proc.stdout[-3000:]
    assert again == first
    # A change in the tree, with no new version or commit: built, and the new wheel has it.
    module = clone / "exporter" / "src" / "pathprobe" / "units.py"
    module.write_text(module.read_text() + "# changed\n")
    proc, changed = artifact_play(tmp_path, source)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert changed["key"] != first["key"] and changed["wheel"] != first["wheel"]
    assert wheel_file(changed["wheel"], "pathprobe/units.py").endswith("# changed\n")
    assert "DIRTY = True" in wheel_file(changed["wheel"], "pathprobe/_version.py")
    # Back as it was: the first build, not built again.
    run(["git", "-C", str(clone), "checkout", "--", "exporter"]).check_returncode()
    proc, back = artifact_play(tmp_path, source)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert task_result(proc.stdout, "Build the wheel of this content") == "ok"
    assert back == first
    assert len(list((tmp_path / "wheels").glob("source-*"))) == 2


@pytest.fixture(scope="module")
def release_a(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return release(tmp_path_factory.mktemp("release-a"), "v1.0.0")


@pytest.fixture(scope="module")
def release_b(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return release(tmp_path_factory.mktemp("release-b"), "v1.1.0")


def test_a_release_wheel_is_taken_only_if_it_matches_its_checksums(tmp_path: Path, release_a: Release) -> None:
    proc, taken = artifact_play(tmp_path, {"pathprobe_release_wheel": f"file://{release_a.wheel}"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert taken["version"] == "1.0.0"
    assert taken["key"] == hashlib.sha256(release_a.wheel.read_bytes()).hexdigest()[:12]
    assert Path(taken["wheel"]).read_bytes() == release_a.wheel.read_bytes()
    # A wheel that is not the one its SHA256SUMS names: the play stops, naming both, and it never lands.
    other = tmp_path / "other"
    shutil.copytree(release_a.dist, other)
    (other / release_a.wheel.name).write_bytes(release_a.wheel.read_bytes() + b"\0")
    wheels = tmp_path / "wheels-refused"
    proc, _ = artifact_play(
        tmp_path, {"pathprobe_release_wheel": str(other / release_a.wheel.name), "pathprobe_wheel_dir": str(wheels)}
    )
    said = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert (
        f"pathprobe_release_wheel {other / release_a.wheel.name} is not installed anywhere: checking it against "
        f"pathprobe_release_checksums {other}/SHA256SUMS failed: The checksum for" in said
    ), proc.stdout[-3000:]
    assert not (wheels / "releases" / release_a.wheel.name).exists()
    # SHA256SUMS without the wheel's line: stopped as well.
    sums = other / "SHA256SUMS"
    sums.write_text("".join(line for line in sums.read_text().splitlines(keepends=True) if ".whl" not in line))
    proc, _ = artifact_play(
        tmp_path, {"pathprobe_release_wheel": str(other / release_a.wheel.name), "pathprobe_wheel_dir": str(wheels)}
    )
    assert proc.returncode != 0 and "Unable to find a checksum for file" in proc.stdout, proc.stdout[-3000:]
    assert not (wheels / "releases" / release_a.wheel.name).exists()


@pytest.mark.parametrize(
    ("hosts", "legacy", "refused"),
    [
        (
            {"old": "3.12", "new": "3.18"},
            False,
            "new runs iperf3 3.18. Of this play's hosts, old run iperf3 older than "
            "3.17, which has only the old padding of iperf3's credentials, and new",
        ),
        ({"old": "3.12", "new": "3.18"}, True, None),
        (
            {"old": "3.12", "new": "3.18", "newest": "3.20"},
            True,
            "newest run iperf3 3.20 or later, whose client has the new padding only",
        ),
        ({"new": "3.18", "newest": "3.20"}, False, None),
    ],
)
def test_hosts_whose_iperf3_cannot_authenticate_each_other_are_named(
    tmp_path: Path, hosts: dict[str, str], legacy: bool, refused: str | None
) -> None:
    # 3.12: this machine's (Debian 12's) iperf3. Newer ones: what their --version and --help print
    # (the lines the role reads; Debian 13's 3.18 runs for real in the deployment test below).
    paths = {}
    for host, version in hosts.items():
        paths[host] = "/usr/sbin:/usr/bin:/sbin:/bin"
        if version != "3.12":
            stub = tmp_path / version / "iperf3"
            stub.parent.mkdir(exist_ok=True)
            stub.write_text(
                f"#!/bin/sh\ncase \"$1\" in --version) echo 'iperf {version} (cJSON 1.7.15)';;\n"
                "--help) echo '  --use-pkcs1-padding       use pkcs1 padding at your own risk';; esac\n"
            )
            stub.chmod(0o755)
            paths[host] = f"{stub.parent}:{paths[host]}"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {h: {**local, "iperf3_path": p} for h, p in paths.items()}}}
    check = {
        "name": "The role's check",
        "ansible.builtin.include_role": {"name": FQCN, "tasks_from": "iperf3_padding"},
    }
    play = [
        {
            "name": "iperf3 padding",
            "hosts": "all",
            "gather_facts": False,
            "environment": {"PATH": "{{ iperf3_path }}"},
            "tasks": [check],
        }
    ]
    proc = local_play(tmp_path, inventory, play, {"pathprobe_iperf3_legacy_rsa_padding": legacy})
    if refused is None:
        assert proc.returncode == 0, proc.stdout[-3000:]
    else:
        assert proc.returncode != 0
        assert refused in " ".join(proc.stdout.split()), proc.stdout[-3000:]


# A Graviton host, as a chroot: the role picks its wheelhouse from its own facts (Ansible's
# chroot connection) and the exporter installs from it alone and checks a config there (its
# compiled dependencies loaded). Every program there runs under qemu-user, whose Linux (7.2,
# Debian 12) refuses the socket options the responders' kernel timestamps need (SO_TIMESTAMPNS:
# "Protocol not available"), which a Graviton's kernel has: the exporter checks its config there
# but does not run. (The Debian 13 host boots in the deployment test below.)
GRAVITON_ROOTFS, GRAVITON_WHEELHOUSE = "bookworm-arm64", "aarch64-py3.11"
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # the host's, not this machine's
CHROOT_CONFIG = yaml.safe_dump(
    {
        "host": {"name": "a", "address": "127.0.0.1", "region": "r1"},
        "peers": [{"name": "b", "address": "127.0.0.2", "region": "r2", "path_class": "inter_region"}],
    }
)


@pytest.mark.lab
def test_a_graviton_host_installs_its_wheelhouse_and_checks_a_config(tmp_path: Path) -> None:
    root = ROOTFS / "wheels-graviton"
    shutil.rmtree(root, ignore_errors=True)
    run(["cp", "-a", str(rootfs(GRAVITON_ROOTFS)), str(root)]).check_returncode()
    try:
        inventory = {
            "all": {
                "hosts": {
                    "graviton": {
                        "ansible_connection": "community.general.chroot",
                        "ansible_host": str(root),
                        "ansible_python_interpreter": "/usr/bin/python3",
                    }
                }
            }
        }
        play = [
            {
                "name": "Wheels",
                "hosts": "all",
                "gather_facts": True,
                "tasks": [{"name": "The role's wheels", "ansible.builtin.include_role": WHEELS_TASKS}],
            }
        ]
        proc = local_play(
            tmp_path,
            inventory,
            play,
            {"pathprobe_wheel_dir": str(tmp_path / "wheels"), "pathprobe_source_dir": str(ROOT / "exporter")},
        )
        assert proc.returncode == 0, proc.stdout[-3000:]
        houses = wheelhouses(tmp_path / "wheels")
        assert sorted(houses) == [GRAVITON_WHEELHOUSE]
        shutil.copytree(houses[GRAVITON_WHEELHOUSE], root / "opt" / "pathprobe" / "wheels")
        inside = ["chroot", str(root)]
        assert run([*inside, "uname", "-m"]).stdout.strip() == "aarch64"
        run([*inside, "python3", "-m", "venv", "/opt/pathprobe/venv"], env=CHROOT_ENV).check_returncode()
        version = houses[GRAVITON_WHEELHOUSE].name.rsplit("-", 2)[1]
        pip = run(
            [
                *inside,
                "/opt/pathprobe/venv/bin/pip",
                "install",
                "--no-index",
                "--find-links",
                "/opt/pathprobe/wheels",
                f"pathprobe=={version}",
            ],
            env=CHROOT_ENV,
        )
        assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
        (root / "etc" / "pathprobe.yaml").write_text(CHROOT_CONFIG)
        checked = run(
            [*inside, "/opt/pathprobe/venv/bin/pathprobe", "check-config", "/etc/pathprobe.yaml"], env=CHROOT_ENV
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


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


# Cloud images' Debian 12 and, for Singapore, Debian 13 (Python 3.13, iperf3 3.18 beside the
# others' 3.12): systemd, dbus and sshd, Python, and the packages the role installs (the lab's
# hosts have no route to a mirror: the role's apt task finds them installed).
ROOTFS_OF = {"dep-tokyo": "base", "dep-osaka": "base", "dep-singapore": "trixie-amd64"}
PYTHON_OF = {"base": "3.11", "trixie-amd64": "3.13"}
SSH_OPTIONS = [
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=5",
]


def boot(name: str, root: Path, work: Path) -> subprocess.Popen[bytes]:
    """The host's root filesystem booted with systemd as PID 1 inside the host's lab namespace
    (CAP_NET_ADMIN: the unit applies the firewall inside that namespace only)."""
    cmd = [
        "systemd-nspawn",
        "--boot",
        f"--directory={root}",
        f"--machine={name}",
        "--register=no",
        "--keep-unit",
        "--console=passive",
        "--capability=CAP_NET_ADMIN",
        f"--network-namespace-path=/run/netns/{ns(name)}",
    ]
    return spawn(cmd, work / f"{name}.console.log", f"systemd host {name}")


def ssh(deployed: dict, host: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    key = deployed["work"] / "id_ed25519"
    cmd = ["ssh", "-i", str(key), *SSH_OPTIONS, f"root@{deployed['addresses'][host]}", command]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def ssh_ready(address: str) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, 22), timeout=1) as conn:
        return conn.recv(4).startswith(b"SSH-")
    return False


def web_credentials(work: Path, addresses: list[str]) -> dict[str, Any]:
    """/metrics over mutual TLS with basic auth: a certificate for the hosts' addresses, a CA that
    signs the scrapers' client certificates and one such certificate (Prometheus's), and a
    password, as a fleet keeps them in Vault (both plays read them)."""
    cert, key = work / "web-cert.pem", work / "web-key.pem"
    sans = ",".join(f"IP:{a}" for a in addresses)
    openssl = functools.partial(subprocess.run, check=True, capture_output=True, timeout=60)
    openssl(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=pathprobe",
            "-addext",
            f"subjectAltName={sans}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ]
    )
    ca, ca_key, client, client_key = (work / f"{n}.pem" for n in ("client-ca", "client-ca-key", "client", "client-key"))
    openssl(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=scrapers",
            "-keyout",
            str(ca_key),
            "-out",
            str(ca),
        ]
    )
    openssl(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=prometheus",
            "-CA",
            str(ca),
            "-CAkey",
            str(ca_key),
            "-addext",
            "extendedKeyUsage=clientAuth",
            "-keyout",
            str(client_key),
            "-out",
            str(client),
        ]
    )
    return {
        "pathprobe_web_tls_cert": cert.read_text(),
        "pathprobe_web_tls_key": key.read_text(),
        "pathprobe_web_tls_client_ca": ca.read_text(),
        "pathprobe_web_config_basic_auth_users": {"prometheus": secrets.token_urlsafe(16)},
    }


def scraper_tls(work: Path, client_certificate: bool = True) -> ssl.SSLContext:
    """What a scraper of the deployed hosts holds: their certificate as its CA, and its own."""
    tls = ssl.create_default_context(cafile=str(work / "web-cert.pem"))
    if client_certificate:
        tls.load_cert_chain(work / "client.pem", work / "client-key.pem")
    return tls


def inventory(work: Path, hosts: dict[str, dict], probes: dict, web: dict[str, Any], extra: dict) -> Path:
    out = work / "hosts.yml"
    out.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": web,
                    "children": {
                        "pathprobe": {
                            "hosts": hosts,
                            "vars": {
                                "ansible_user": "root",
                                "ansible_ssh_private_key_file": str(work / "id_ed25519"),
                                "ansible_ssh_common_args": " ".join(SSH_OPTIONS),
                                "ansible_python_interpreter": "/usr/bin/python3",
                                "pathprobe_service_manage": True,
                                "pathprobe_iperf3_auth": True,
                                "pathprobe_iperf3_keys_dir": str(work / "keys"),
                                "pathprobe_wheel_dir": str(work / "wheels"),
                                "pathprobe_probes": probes,
                                "pathprobe_schedule": {
                                    "slot_seconds": 16,
                                    "jitter_seconds": 1,
                                    "timeout_margin_seconds": 3,
                                },
                                **extra,
                            },
                        },
                        "monitoring": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_become": False,
                                    "ansible_python_interpreter": sys.executable,
                                }
                            }
                        },
                    },
                }
            }
        )
    )
    return out


PROBES = {
    "throughput": {"streams": [1], "duration_seconds": 2, "omit_seconds": 1},
    "rtt": {"interval_seconds": 0.1},
    "loss": {"rate_pps": 10},
}


def installed(rel: Release, work: Path) -> str:
    """The release's collection installed from its tarball (once) into a directory of its own under
    `work`: what ANSIBLE_COLLECTIONS_PATH names for a play of that release, instead of ansible.cfg's."""
    into = work / f"collections-{rel.version}"
    if not into.exists():
        proc = run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(into), str(rel.collection)])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(into)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, release_a: Release) -> Iterator[dict]:
    """Three systemd hosts deployed as a team would from a release: its collection installed from its
    tarball (the role the plays run is that copy, not this repository's) and its wheel."""
    work = tmp_path_factory.mktemp("ansible")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "id_ed25519")], check=True)
    bases = {name: rootfs(name) for name in set(ROOTFS_OF.values())}
    net.up(TOPOLOGY)
    roots, machines, addresses = {}, {}, {}
    try:
        for i, h in enumerate(TOPOLOGY.hosts, start=1):
            root = ROOTFS / h.name
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run(["cp", "-a", str(bases[ROOTFS_OF[h.name]]), str(root)], check=True)
            (root / "root" / ".ssh").mkdir(mode=0o700, exist_ok=True)
            shutil.copy(work / "id_ed25519.pub", root / "root" / ".ssh" / "authorized_keys")
            roots[h.name], addresses[h.name] = root, address(i)
            machines[h.name] = boot(h.name, root, work)
        for name, addr in addresses.items():
            wait_for(f"sshd on {name}", lambda addr=addr: ssh_ready(addr), timeout=60)
        hosts = {
            h.name: {
                "ansible_host": addresses[h.name],
                "pathprobe_address": addresses[h.name],
                "pathprobe_region": h.region,
                "pathprobe_zone": h.zone,
            }
            for h in TOPOLOGY.hosts
        }
        file_sd = work / "file_sd" / "pathprobe.json"
        web = web_credentials(work, list(addresses.values()))

        def play(
            probes: dict, extra: dict | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
            # monitoring_install_rules as JSON: a boolean, not the string "false". The fleet mixes
            # iperf3 3.12 and 3.18: their authentication needs the old padding.
            padding = {"pathprobe_iperf3_legacy_rsa_padding": True}
            wheel = {"pathprobe_release_wheel": str(release_a.wheel)}
            hosts_file = inventory(work, hosts, probes, web, padding | wheel | (extra or {}))
            return playbook(
                hosts_file,
                "playbooks/site.yml",
                "playbooks/monitoring.yml",
                "-e",
                f"monitoring_file_sd_path={file_sd}",
                "-e",
                '{"monitoring_install_rules": false}',
                "-e",
                f"monitoring_scrape_password_file={work / 'prometheus-password'}",
                "-e",
                f"monitoring_scrape_ca_file={work / 'prometheus-ca.pem'}",
                home=work,
                timeout=1200,
                env={"ANSIBLE_COLLECTIONS_PATH": installed(release_a, work)} | (env or {}),
            )

        # Without that, the play stops before the exporter is installed anywhere.
        mixed = play(PROBES, {"pathprobe_iperf3_legacy_rsa_padding": False})
        nothing_yet = {h: (roots[h] / "opt" / "pathprobe").exists() for h in roots}
        first = play(PROBES)
        second = play(PROBES) if first.returncode == 0 else first
        yield {
            "work": work,
            "roots": roots,
            "addresses": addresses,
            "first": first,
            "second": second,
            "mixed": mixed,
            "installed_after_mixed": nothing_yet,
            "file_sd": file_sd,
            "play": play,
            "password": web["pathprobe_web_config_basic_auth_users"]["prometheus"],
            "release": (release_a.version, release_a.revision),
        }
    finally:
        for proc in machines.values():  # SIGTERM: systemd powers the host off (its units stop in order)
            procs.terminate(proc.pid, grace=30)
        net.down()
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


def recap(output: str) -> dict[str, dict[str, int]]:
    found = {}
    for host, stats in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stats)}
    return found


@pytest.mark.lab
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
        assert cfg["iperf3"]["auth"]["legacy_rsa_padding"] is True
        # Only what the inventory set is written; the exporter's defaults apply to the rest.
        assert cfg["probes"]["rtt"] == {"interval_seconds": 0.1} and "responders" not in cfg
        assert cfg["budget"] == {"state_file": "/var/lib/pathprobe/budget.json"}
        assert cfg["web"]["config_file"] == "/etc/pathprobe/web-config.yml"
        web = root / "etc" / "pathprobe" / "web-config.yml"
        assert web.stat().st_mode & 0o777 == 0o640
        assert set(yaml.safe_load(web.read_text())) == {"tls_server_config", "basic_auth_users"}
    targets = json.loads(deployed["file_sd"].read_text())
    assert {t["labels"]["host"] for t in targets} == {h.name for h in TOPOLOGY.hosts}
    assert all(t["labels"]["region"] and t["labels"]["zone"] for t in targets)


@pytest.mark.lab
def test_a_play_mixing_iperf3_older_and_newer_than_3_17_stops_naming_both(deployed: dict) -> None:
    mixed = deployed["mixed"]
    assert mixed.returncode != 0
    said = " ".join(mixed.stdout.split())
    older = ", ".join(sorted(h for h, r in ROOTFS_OF.items() if r == "base"))
    of_the_play = f"Of this play's hosts, {older} run iperf3 older than 3.17, which has only the old padding "
    newer = "of iperf3's credentials, and dep-singapore an iperf3 with the new padding (3.17 or later)"
    assert f"dep-singapore runs iperf3 3.18. {of_the_play}{newer}" in said, mixed.stdout[-3000:]
    assert f"dep-tokyo runs iperf3 3.12. {of_the_play}{newer}" in said
    assert deployed["installed_after_mixed"] == dict.fromkeys(ROOTFS_OF, False)


@pytest.mark.lab
def test_the_unit_runs_under_its_hardening(deployed: dict) -> None:
    unit = next(iter(deployed["roots"].values())) / "etc" / "systemd" / "system" / "pathprobe.service"
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # The commands it names are in the host's root filesystem, not on this machine.
    problems = [line for line in verify.stderr.splitlines() if line.strip() and "is not executable" not in line]
    assert problems == [], verify.stderr
    text = unit.read_text()
    assert "ExecStartPre=+" in text and "pathprobe firewall --config" in text and "--remove" in text
    for host in deployed["addresses"]:
        # Started by systemd, not by this test; still running under every option of the unit.
        state = ssh(deployed, host, "systemctl show pathprobe -p ActiveState -p SubState -p NRestarts -p User")
        shown = dict(line.split("=", 1) for line in state.stdout.split())
        want = {"User": "pathprobe", "NRestarts": "0", "ActiveState": "active", "SubState": "running"}
        assert shown == want, state.stdout + ssh(deployed, host, "journalctl -u pathprobe --no-pager | tail -30").stdout
        # Exposure on systemd's 0-10 scale, of the running unit ("1.3 OK"); --threshold takes tenths.
        security = ssh(deployed, host, "systemd-analyze security --threshold=15 pathprobe.service")
        assert security.returncode == 0, security.stdout[-3000:] + security.stderr
        # The firewall the unit applied as root, in front of the iperf3 port.
        assert "table inet pathprobe" in ssh(deployed, host, "nft list tables").stdout


@pytest.mark.lab
def test_deployed_exporters_probe_each_other(deployed: dict) -> None:
    work = deployed["work"]
    assert deployed["second"].returncode == 0
    # As the monitoring play's header says: https, its CA file and password file.
    prom_cfg = {
        "global": {"scrape_interval": "5s"},
        "scrape_configs": [
            {
                "job_name": "pathprobe",
                "file_sd_configs": [{"files": [str(deployed["file_sd"])]}],
                "scheme": "https",
                "tls_config": {
                    "ca_file": str(work / "prometheus-ca.pem"),
                    "cert_file": str(work / "client.pem"),
                    "key_file": str(work / "client-key.pem"),
                },
                "basic_auth": {"username": "prometheus", "password_file": str(work / "prometheus-password")},
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    spawn(
        [
            demo.binary("prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{PROM_PORT}",
        ],
        work / "prometheus.log",
        "prometheus (ansible test)",
    )
    url = f"http://127.0.0.1:{PROM_PORT}"
    demo.wait_ready(f"{url}/-/ready", "Prometheus")
    names = [h.name for h in TOPOLOGY.hosts]
    paths = {(a, b) for a in names for b in names if a != b}

    def measured(metric: str) -> set[tuple[str, str]]:
        return {(s["metric"]["host"], s["metric"]["peer"]) for s in promql.query(url, metric)}

    wait_for("RTT for every path", lambda: measured("pathprobe_rtt_seconds_count") >= paths, timeout=90)
    # Without the password, /metrics says 401; without a client certificate, there is no TLS session.
    first = next(iter(deployed["addresses"].values()))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(metrics_request(first, None), timeout=5, context=scraper_tls(work))
    assert refused.value.code == 401
    with pytest.raises((ssl.SSLError, ConnectionResetError, urllib.error.URLError)):
        urllib.request.urlopen(
            metrics_request(first, deployed["password"]), timeout=5, context=scraper_tls(work, client_certificate=False)
        )
    # Throughput through iperf3 with the RSA keys the play generated and distributed, Debian 13's
    # iperf3 with Debian 12's both ways.
    wait_for(
        "throughput for every path", lambda: measured("pathprobe_throughput_bytes_per_second") >= paths, timeout=180
    )
    # Each host runs the exporter on its own Python, from its own wheelhouse: the release's, which says
    # its version and commit.
    builds = promql.query(url, "pathprobe_build_info")
    pythons = {s["metric"]["host"]: s["metric"]["python_version"][:4] for s in builds}
    assert pythons == {h: PYTHON_OF[r] for h, r in ROOTFS_OF.items()}
    assert {(s["metric"]["version"], s["metric"]["revision"]) for s in builds} == {deployed["release"]}, builds


def main_pids(deployed: dict) -> dict[str, str]:
    return {
        h: ssh(deployed, h, "systemctl show pathprobe -p MainPID --value").stdout.strip() for h in deployed["addresses"]
    }


# The settings of the test below, which later plays keep (a play with others would change the config).
RELOADED_PROBES = PROBES | {"rtt": {"interval_seconds": 0.2}}
# With client certificates verified if given (not required), the role's wait after the restart
# reads /-/ready (the first plays, certificates required, waited for the port).
RESTARTED = {
    "pathprobe_budget": {"daily_bytes": "40GB"},
    "pathprobe_web_config_tls_server_config": {"client_auth_type": "VerifyClientCertIfGiven"},
}


@pytest.mark.lab
def test_a_probe_change_reloads_and_a_budget_change_restarts_the_exporters(deployed: dict) -> None:
    before = main_pids(deployed)
    changed = deployed["play"](RELOADED_PROBES)
    assert changed.returncode == 0, changed.stdout[-4000:] + changed.stderr[-2000:]
    assert changed.stdout.count(f"RUNNING HANDLER [{FQCN} : Apply the pathprobe configuration]") == 1
    assert main_pids(deployed) == before  # reloaded (systemctl reload: SIGHUP), not restarted
    for host, addr in deployed["addresses"].items():
        wait_for(
            f"{host} reloaded with the new RTT interval",
            lambda addr=addr: (
                'interval_seconds="0.2"' in metrics_text(deployed, addr)
                and 'pathprobe_config_reloads_total{result="success"} 1.0' in metrics_text(deployed, addr)
            ),
            timeout=30,
        )
        assert ssh(deployed, host, "systemctl show pathprobe -p NRestarts --value").stdout.strip() == "0"
    changed = deployed["play"](RELOADED_PROBES, RESTARTED)
    assert changed.returncode == 0, changed.stdout[-4000:] + changed.stderr[-2000:]
    assert waited(changed.stdout) == {"Wait until pathprobe is ready": "ok", "Wait until pathprobe listens": "skipping"}
    assert waited(deployed["second"].stdout) == {
        "Wait until pathprobe is ready": "skipping",
        "Wait until pathprobe listens": "ok",
    }
    after = main_pids(deployed)
    assert all(after[h] not in ("", "0", before[h]) for h in before), (before, after)
    for host, addr in deployed["addresses"].items():
        wait_for(f"/metrics of {host} after the restart", lambda addr=addr: metrics_answer(deployed, addr), timeout=30)
        cfg = yaml.safe_load(ssh(deployed, host, "cat /etc/pathprobe/pathprobe.yaml").stdout)
        assert cfg["probes"]["rtt"] == {"interval_seconds": 0.2} and cfg["budget"]["daily_bytes"] == "40GB"


# Samples, five a second, of how many exporters run on a host: `pathprobe run` processes that systemd
# (PID 1) started, not an exporter's own children between their fork and their exec (iperf3's).
# pgrep's pattern does not match the script itself.
WATCH = """#!/bin/sh
while :; do echo "$(date +%s.%N) $(pgrep -P 1 -fc '[b]in/pathprobe run ')"; sleep 0.2; done > "$1"
"""


@contextlib.contextmanager
def exporters_counted(deployed: dict) -> Iterator[dict[str, list[tuple[float, int]]]]:
    """While the block runs, each host samples how many exporters it runs: (time, count), per host."""
    samples: dict[str, list[tuple[float, int]]] = {}
    log = f"/root/pathprobe-watch-{secrets.token_hex(4)}.log"  # each block's samples in a file of their own
    watchers = {}
    for host, root in deployed["roots"].items():
        script = root / "usr" / "local" / "bin" / "pathprobe-watch"
        script.write_text(WATCH)
        script.chmod(0o755)
        # A process of the SSH session, stopped by its PID: the sampler is the test's, not the host's,
        # and a transient systemd unit's `systemctl stop` hung past a minute on this machine's
        # cgroup v1 inside a container (`systemctl kill` of it: "Input/output error").
        started = ssh(
            deployed, host, f"nohup /usr/local/bin/pathprobe-watch {log} > /dev/null 2>&1 < /dev/null & echo $!"
        )
        assert started.returncode == 0 and started.stdout.strip().isdigit(), started
        watchers[host] = started.stdout.strip()
    try:
        yield samples
    finally:
        for host, root in deployed["roots"].items():
            stopped = ssh(deployed, host, f"kill {watchers[host]}")
            assert stopped.returncode == 0, (host, stopped.stderr)
            lines = (root / log.lstrip("/")).read_text().split("\n")
            samples[host] = [(float(t), int(n)) for t, n in (line.split() for line in lines if line.count(" ") == 1)]


def without_exporter(samples: list[tuple[float, int]]) -> list[float]:
    """How long each stretch of samples without an exporter lasted, up to the next sample with one."""
    stretches, since = [], None
    for at, count in samples:
        if count == 0 and since is None:
            since = at
        elif count > 0 and since is not None:
            stretches.append(at - since)
            since = None
    return stretches + ([samples[-1][0] - since] if since is not None else [])


def metric_value(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


@pytest.mark.lab
def test_an_upgrade_and_a_rollback_reach_every_host_with_its_state_and_one_restart(
    deployed: dict, release_a: Release, release_b: Release
) -> None:
    """Release A runs (the plays above); B, then A again, each from its own collection and wheel."""
    work, roots, addresses = deployed["work"], deployed["roots"], deployed["addresses"]
    kept = ["etc/pathprobe/iperf3-private.pem", "etc/pathprobe/iperf3-public.pem", "etc/pathprobe/iperf3-password"]

    def state() -> dict[str, object]:
        files = {f"{h}:{f}": hashlib.sha256((roots[h] / f).read_bytes()).hexdigest() for h in roots for f in kept}
        keys = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (work / "keys").iterdir()}
        return files | keys

    def venvs(host: str) -> set[str]:
        return {p.name.split("-")[0] for p in (roots[host] / "opt" / "pathprobe" / "venvs").iterdir()}

    before = state()
    texts = {h: metrics_text(deployed, a) for h, a in addresses.items()}
    remaining = {h: metric_value(t, "pathprobe_budget_remaining_bytes") for h, t in texts.items()}
    limits = {h: metric_value(t, "pathprobe_budget_limit_bytes") for h, t in texts.items()}
    assert all(remaining[h] < limits[h] for h in addresses), (remaining, limits)  # the tests above spent some
    marker = (roots["dep-tokyo"] / "opt" / "pathprobe" / "venv").resolve() / ".pathprobe-installed"  # A's
    installed_a = marker.stat().st_mtime
    # Each release comes with a change only a restart applies (the budget's daily limit): the new
    # build's restart applies it as well, and the exporter stops once.
    for rel, other, daily in ((release_b, release_a, "39GB"), (release_a, release_b, "40GB")):
        with exporters_counted(deployed) as samples:
            proc = deployed["play"](
                RELOADED_PROBES,
                RESTARTED | {"pathprobe_release_wheel": str(rel.wheel), "pathprobe_budget": {"daily_bytes": daily}},
                {"ANSIBLE_COLLECTIONS_PATH": installed(rel, work)},
            )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        for host, addr in addresses.items():
            build = f'revision="{rel.revision}",version="{rel.version}"'  # the exposition sorts labels
            wait_for(
                f"{host} on {rel.version}", lambda addr=addr, build=build: build in metrics_text(deployed, addr), 30
            )
            said = ssh(deployed, host, "/opt/pathprobe/venv/bin/pathprobe --version").stdout
            assert said.startswith(f"pathprobe {rel.version} (revision {rel.revision}, Python "), said
            # One exporter at a time, and none only while the unit restarts, once.
            assert max(n for _, n in samples[host]) == 1, samples[host]
            gaps = without_exporter(samples[host])
            assert len(gaps) == 1 and gaps[0] < 15, (host, gaps, handlers_run(proc.stdout), unit_log(deployed, host))
            # The budget spent so far is still spent; the build that ran before stays installed.
            text = metrics_text(deployed, addr)
            assert metric_value(text, "pathprobe_budget_remaining_bytes") <= remaining[host]
            assert metric_value(text, "pathprobe_budget_state_unusable") == 0
            assert metric_value(text, "pathprobe_budget_limit_bytes") == int(daily.removesuffix("GB")) * 10**9
            assert venvs(host) == {rel.version, other.version}, venvs(host)
        assert state() == before  # the mesh's iperf3 keys and password, on the controller and the hosts
    # Back to A: installed already, not again; the link switched and the exporter restarted.
    assert task_result(
        proc.stdout, "Install the exporter into this build's virtualenv, from the copied wheels only"
    ) == ("skipping")
    assert marker.stat().st_mtime == installed_a


def handlers_run(output: str) -> list[str]:
    return re.findall(r"^RUNNING HANDLER \[[^\]]*\]", output, re.M)


def unit_log(deployed: dict, host: str) -> str:
    """The exporter unit's last journal lines on the host, for a failure's message."""
    return ssh(deployed, host, "journalctl -u pathprobe -n 40 --no-pager -o short-precise").stdout


def waited(output: str) -> dict[str, str]:
    """The role's two waits after a start, each with what the first host's line said (ok, skipping)."""
    found = re.findall(rf"^TASK \[{FQCN} : (Wait until pathprobe (?:is ready|listens))[^\n]*\n(\w+)", output, re.M)
    return dict(found)


def metrics_request(address: str, password: str | None) -> urllib.request.Request:
    req = urllib.request.Request(f"https://{address}:9469/metrics")
    if password is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode())
    return req


def metrics_text(deployed: dict, address: str) -> str:
    tls = scraper_tls(deployed["work"])
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(metrics_request(address, deployed["password"]), timeout=2, context=tls) as r,
    ):
        return str(r.read().decode())
    return ""


def metrics_answer(deployed: dict, address: str) -> bool:
    tls = scraper_tls(deployed["work"])
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(metrics_request(address, deployed["password"]), timeout=2, context=tls) as r,
    ):
        return b"pathprobe_peer_info" in r.read()
    return False


@pytest.mark.lab
def test_systemctl_stop_stops_within_the_timeout_and_leaves_nothing(deployed: dict) -> None:
    host = next(iter(deployed["addresses"]))
    assert ssh(deployed, host, "pgrep -x iperf3").stdout.strip(), "the exporter's iperf3 server should run"
    stop = ssh(deployed, host, "systemctl stop pathprobe")
    assert stop.returncode == 0, stop.stderr
    # systemd's own timing, not this test's (which adds SSH): a stop past TimeoutStopSec=10s is killed
    # and ends in Result=timeout.
    assert ssh(deployed, host, "systemctl show pathprobe -p Result --value").stdout.strip() == "success"
    assert ssh(deployed, host, "pgrep -x iperf3").returncode == 1, "an iperf3 outlived the exporter"
    assert "table inet pathprobe" not in ssh(deployed, host, "nft list tables").stdout


@pytest.mark.lab
def test_a_port_another_program_holds_stops_the_first_start(deployed: dict) -> None:
    # After the stop above the unit is inactive: a program on the /metrics port before the start.
    host = next(iter(deployed["addresses"]))
    # SO_REUSEADDR: the stopped exporter's scrapes left TIME_WAIT connections on the port.
    holder = (
        "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('', 9469)); s.listen(); time.sleep(600)"
    )
    squat = f'systemd-run --unit=squatter python3 -c "{holder}"'
    assert ssh(deployed, host, squat).returncode == 0
    try:
        wait_for("the squatter on 9469", lambda: ":9469 " in ssh(deployed, host, "ss -Hltn").stdout, timeout=10)
    except AssertionError as exc:
        raise AssertionError(ssh(deployed, host, "ss -Hltn; systemctl status squatter --no-pager").stdout) from exc
    proc = deployed["play"](PROBES | {"rtt": {"interval_seconds": 0.2}})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "web.listen: 0.0.0.0:9469/tcp is not free on this host" in proc.stdout, proc.stdout[-3000:]
    assert "pathprobe_web_listen" in proc.stdout
    assert ssh(deployed, host, "systemctl is-active pathprobe").stdout.strip() == "inactive"


def test_the_monitoring_play_renders_the_rules_with_the_fleets_parameters(tmp_path: Path) -> None:
    inventory = {
        "all": {
            "children": {
                "pathprobe": {"hosts": {"a": {"pathprobe_region": "r1", "ansible_host": "198.18.1.2"}}},
                "monitoring": {
                    "hosts": {
                        "localhost": {
                            "ansible_connection": "local",
                            "ansible_become": False,
                            "ansible_python_interpreter": sys.executable,
                        }
                    }
                },
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    scratch = tmp_path / "scratch"  # the controller's TMPDIR: the play's work directory goes there
    scratch.mkdir()

    def play(params: dict) -> subprocess.CompletedProcess[str]:
        extra = {
            "monitoring_alert_params": params,
            "monitoring_file_sd_path": str(tmp_path / "file_sd" / "pathprobe.json"),
            "monitoring_rules_dir": str(tmp_path / "rules"),
            "monitoring_alertmanager_config": str(tmp_path / "alertmanager.yml"),
        }
        return playbook(
            tmp_path / "hosts.yml",
            "playbooks/monitoring.yml",
            "-e",
            json.dumps(extra),
            home=tmp_path,
            env={"TMPDIR": str(scratch)},
        )

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


def test_the_monitoring_play_writes_a_regional_and_a_global_prometheus(tmp_path: Path) -> None:
    hosts = {
        "a": {"pathprobe_region": "r1", "ansible_host": "198.18.1.2"},
        "b": {"pathprobe_region": "r2", "ansible_host": "198.18.2.2"},
    }
    local = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable}
    for layout, extra in (
        ("regional", {"monitoring_region": "r1", "monitoring_remote_write_url": "http://global:9090/api/v1/write"}),
        ("global", {}),
    ):
        work = tmp_path / layout
        work.mkdir()
        inventory = {
            "all": {
                "children": {
                    "pathprobe": {"hosts": hosts},
                    "monitoring": {"hosts": {layout: local | {"monitoring_layout": layout, **extra}}},
                }
            }
        }
        (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
        settings = {
            "monitoring_file_sd_path": str(work / "pathprobe.json"),
            "monitoring_rules_dir": str(work),
            "monitoring_alertmanager_config": str(work / "alertmanager.yml"),
            "monitoring_prometheus_config": str(work / "prometheus.yml"),
            # /metrics with mutual TLS and a user given with its password, one with a hash only
            "pathprobe_web_tls_cert": "PEM",
            "monitoring_scrape_ca_file": str(work / "ca.pem"),
            "monitoring_scrape_client_cert_file": str(work / "client.pem"),
            "monitoring_scrape_client_key_file": str(work / "client-key.pem"),
            "monitoring_scrape_password_file": str(work / "password"),
            "pathprobe_web_config_basic_auth_users": {"ops": "$2b$04$" + "a" * 53, "scraper": "pw"},
        }
        for name in ("client.pem", "client-key.pem"):  # promtool checks that they exist
            (work / name).write_text("PEM")
        proc = playbook(work / "hosts.yml", "playbooks/monitoring.yml", "-e", json.dumps(settings), home=work)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        written = yaml.safe_load((work / "prometheus.yml").read_text())
        assert written["global"]["external_labels"] == {"prometheus": layout}
        if layout == "regional":  # its region's exporters, the rules, region pairs sent on
            assert [t["labels"]["region"] for t in json.loads((work / "pathprobe.json").read_text())] == ["r1"]
            assert written["scrape_configs"][0]["file_sd_configs"] == [{"files": [str(work / "pathprobe.json")]}]
            assert written["scrape_configs"][0]["basic_auth"] == {
                "username": "scraper",
                "password_file": str(work / "password"),
            }
            assert written["scrape_configs"][0]["tls_config"] == {
                "ca_file": str(work / "ca.pem"),
                "cert_file": str(work / "client.pem"),
                "key_file": str(work / "client-key.pem"),
            }
            assert (work / "password").read_text() == "pw" and (work / "ca.pem").read_text() == "PEM"
            assert written["rule_files"] == [str(work / "pathprobe.rules.yml")]
            assert written["remote_write"][0]["url"] == "http://global:9090/api/v1/write"
            assert written["remote_write"][0]["write_relabel_configs"][0]["regex"] == "region_pair:.+"
        else:  # scrapes nothing
            assert "scrape_configs" not in written and "remote_write" not in written
