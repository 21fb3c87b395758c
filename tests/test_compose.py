"""The laptop compose stack, checked with what runs here (no Docker engine): Compose's own
parser, the files it mounts, promtool/amtool on the configs, targets against services."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from pathprobe_lab import alerting

ROOT = Path(__file__).parents[1]
COMPOSE = ROOT / "docker-compose.yml"


def compose_config() -> dict:
    """The file as Compose resolves it (interpolation, anchors, defaults)."""
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "test"}
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_parses_and_refuses_a_missing_grafana_password() -> None:
    services = compose_config()["services"]
    assert {"tokyo", "osaka", "singapore", "prometheus", "alertmanager", "alert-log", "grafana"} <= set(services)
    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in proc.stderr


def test_images_pinned_volumes_named_healthchecks_everywhere() -> None:
    cfg = compose_config()
    for name, svc in cfg["services"].items():
        image = svc.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"
        assert "healthcheck" in svc, f"{name}: no healthcheck"
    assert cfg["services"]["grafana"]["environment"]["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert {"prometheus-data", "alertmanager-data", "grafana-data"} <= set(cfg["volumes"])


def test_every_mounted_file_exists() -> None:
    for name, svc in compose_config()["services"].items():
        for volume in svc.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith(("/", ".")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    assert (ROOT / "exporter" / "Dockerfile").exists() and (ROOT / "exporter" / "docker-entrypoint.sh").exists()
    assert (ROOT / "lab" / "Dockerfile").exists()


def test_prometheus_config_passes_promtool_with_the_mounted_rules(tmp_path: Path) -> None:
    # Lay the files out as the container sees them under /etc/prometheus.
    shutil.copy(ROOT / "compose" / "prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "rules").mkdir()
    shutil.copy(ROOT / "alerts" / "pathprobe.rules.yml", tmp_path / "rules" / "pathprobe.rules.yml")
    proc = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups = yaml.safe_load((ROOT / "alerts" / "pathprobe.rules.yml").read_text())["groups"]
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in proc.stdout


def test_alertmanager_config_passes_amtool_and_is_generated_from_the_production_routing() -> None:
    am = ROOT / "compose" / "alertmanager.yml"
    proc = subprocess.run(["amtool", "check-config", str(am)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url = "http://alert-log:19099/alerts"
    expected = alerting.WEBHOOK_HEADER.format(url=url) + yaml.safe_dump(
        alerting.webhook_routing((ROOT / "alerts" / "alertmanager.yml").read_text(), url), sort_keys=False
    )
    assert am.read_text() == expected, (
        "run: pathprobe lab webhook-routing --url ... --config alerts/alertmanager.yml --out compose/alertmanager.yml"
    )


def test_every_scrape_target_is_a_compose_service_with_its_labels() -> None:
    services = set(compose_config()["services"])
    prom = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                host = target.rsplit(":", 1)[0]
                assert host in services | {"localhost"}, f"{job['job_name']}: {target} is not a compose service"
                if job["job_name"] == "pathprobe":
                    assert {"host", "region", "zone"} <= set(group["labels"])


def test_exporter_configs_are_valid_and_match_the_network() -> None:
    services = compose_config()["services"]
    for name in ("tokyo", "osaka", "singapore"):
        path = ROOT / "compose" / "exporters" / f"{name}.yaml"
        proc = subprocess.run(
            [sys.executable, "-m", "pathprobe", "check-config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        cfg = yaml.safe_load(path.read_text())
        assert cfg["host"]["address"] == services[name]["networks"]["mesh"]["ipv4_address"]
        for peer in cfg["peers"]:
            assert peer["address"] == services[peer["name"]]["networks"]["mesh"]["ipv4_address"]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = path.read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in joined.splitlines())
        if line and not line.startswith("#")
    ]


def test_the_exporter_image_runs_unprivileged_with_net_admin_only_and_oci_labels() -> None:
    steps = dockerfile_instructions(ROOT / "exporter" / "Dockerfile")
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    labels = " ".join(args for op, args in steps if op == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    run = " ".join(args for op, args in steps if op == "RUN")
    assert set(re.findall(r"setcap (\S+)", run)) == {"cap_net_admin+ep"}  # nft and tc: the firewall and the shaping
    assert "SETUPTOOLS_SCM_PRETEND_METADATA_FOR_PATHPROBE" in run and "${REVISION}" in run  # the build info
    assert [args for op, args in steps if op == "HEALTHCHECK" and "/-/ready" in args]
    for name in ("tokyo", "osaka", "singapore"):
        svc = compose_config()["services"][name]
        assert svc["cap_drop"] == ["ALL"] and svc["cap_add"] == ["NET_ADMIN"], name
        assert "/-/ready" in " ".join(svc["healthcheck"]["test"]), name
