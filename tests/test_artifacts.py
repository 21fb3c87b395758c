"""What is released: scripts/build.sh makes, from a tagged commit, the exporter's wheel and sdist,
the monitoring bundle, the Ansible collection and SHA256SUMS, with the tag's version and the commit
in every install path (the wheel, a wheel built from the sdist, the image's build arguments); an
untagged tree gets a dev version with its commit; the collection installs from its tarball alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from releases import ROOT, Release, git, pip_settings, release

BIN = Path(sys.executable).parent
FQCN = "pathprobe.pathprobe.pathprobe"


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return release(tmp_path_factory.mktemp("release"), "v2.3.4")


def baked(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as whl:
        return whl.read("pathprobe/_version.py").decode()


def test_a_release_is_its_tag_and_commit_with_checksums(released: Release) -> None:
    names = sorted(p.name for p in released.dist.iterdir())
    assert names == [
        "SHA256SUMS",
        "pathprobe-2.3.4-py3-none-any.whl",
        "pathprobe-2.3.4.tar.gz",
        "pathprobe-monitoring-2.3.4.tar.gz",
        "pathprobe-pathprobe-2.3.4.tar.gz",
    ]
    sums = ["sha256sum", "-c", "SHA256SUMS"]
    check = subprocess.run(sums, cwd=released.dist, capture_output=True, text=True, check=False)
    assert check.returncode == 0 and check.stdout.count(": OK") == 4, check.stdout + check.stderr
    stamp = baked(released.wheel)
    assert "VERSION = '2.3.4'" in stamp and f"NODE = 'g{released.revision}'" in stamp and "DIRTY = False" in stamp
    with zipfile.ZipFile(released.wheel) as whl:
        assert "pathprobe/webconfig.py" in whl.namelist()
    with tarfile.open(released.dist / "pathprobe-monitoring-2.3.4.tar.gz") as tar:
        bundle = set(tar.getnames())
    prefix = "pathprobe-monitoring-2.3.4/"
    for name in (
        "alerts/pathprobe.rules.yml",
        "alerts/runbook.md",
        "dashboards/json/overview.json",
        "mixin/mixin.libsonnet",
        "mixin/config.libsonnet",
        "mixin/rules.libsonnet",
        "mixin/dashboards.libsonnet",
    ):
        assert prefix + name in bundle, name
    committed = (ROOT / "alerts" / "pathprobe.rules.yml").read_bytes()
    with tarfile.open(released.dist / "pathprobe-monitoring-2.3.4.tar.gz") as tar:
        rules = tar.extractfile(prefix + "alerts/pathprobe.rules.yml")
        assert rules is not None and rules.read() == committed
    with tarfile.open(released.collection) as tar:
        manifest = tar.extractfile("MANIFEST.json")
        assert manifest is not None
        info = json.loads(manifest.read())["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("pathprobe", "pathprobe", "2.3.4")


def wheel_of(source: str | Path, out: Path, env: dict[str, str] | None = None) -> Path:
    """pip wheel of `source` (a directory or an sdist) into `out`, as a user's pip builds it."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": "/usr/bin:/bin"} | pip_settings() | (env or {}),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return next(out.glob("pathprobe-*.whl"))


def test_a_wheel_built_from_the_sdist_keeps_the_version_and_commit(released: Release, tmp_path: Path) -> None:
    wheel = wheel_of(released.dist / "pathprobe-2.3.4.tar.gz", tmp_path)
    assert wheel.name == "pathprobe-2.3.4-py3-none-any.whl"
    assert f"NODE = 'g{released.revision}'" in baked(wheel)


def test_the_image_is_given_its_version_and_commit_where_there_is_no_git(tmp_path: Path) -> None:
    """The Dockerfile's install step: the files it copies, no git, the version and revision as its
    build arguments give them to setuptools-scm."""
    dockerfile = (ROOT / "exporter" / "Dockerfile").read_text().replace("\\\n", " ")
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY") and "/src" in line]
    context = tmp_path / "src"
    context.mkdir()
    for names in copied:
        for name in names:
            copy = shutil.copytree if (ROOT / "exporter" / name).is_dir() else shutil.copy
            copy(ROOT / "exporter" / name, context / name)
    arguments = {"VERSION": "3.0.1", "REVISION": "0123456789abcdef0123456789abcdef01234567"}
    run = next(line for line in dockerfile.splitlines() if "SETUPTOOLS_SCM_PRETEND_VERSION" in line)
    env = {}
    for name, value in re.findall(r'(SETUPTOOLS_SCM_\w+)="((?:[^"\\]|\\.)*)"', run):
        env[name] = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], value.replace('\\"', '"'))
    assert set(env) == {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PATHPROBE", "SETUPTOOLS_SCM_PRETEND_METADATA_FOR_PATHPROBE"}
    wheel = wheel_of(context, tmp_path / "wheels", env)
    assert wheel.name == "pathprobe-3.0.1-py3-none-any.whl"
    assert f"NODE = '{arguments['REVISION']}'" in baked(wheel)


def test_an_untagged_tree_gets_a_dev_version_with_its_commit(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    tags = git(clone, "tag").split()
    if tags:  # the history without its tags: what a tree no release was made from gets
        git(clone, "tag", "-d", *tags)
    scm = [sys.executable, "-m", "setuptools_scm"]
    version = subprocess.run(scm, cwd=clone / "exporter", capture_output=True, text=True, check=True).stdout.strip()
    commits = git(clone, "rev-list", "--count", "HEAD")
    assert version == f"0.1.dev{commits}+g{git(clone, 'rev-parse', '--short=9', 'HEAD')}", version
    # Uncommitted changes: the version says so (a date), as the revision does ("-dirty").
    (clone / "exporter" / "README.md").write_text("changed\n")
    dirty = subprocess.run(scm, cwd=clone / "exporter", capture_output=True, text=True, check=True).stdout.strip()
    assert dirty.startswith(version + ".d"), dirty


def test_the_collection_installs_from_its_tarball_without_galaxy(released: Release, tmp_path: Path) -> None:
    # Galaxy unreachable (a closed port on loopback): the tarball and the installed ansible.posix suffice.
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_GALAXY_SERVER": "http://127.0.0.1:9/"}
    collections = tmp_path / "collections"
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(collections), str(released.collection)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert "pathprobe.pathprobe:2.3.4 was installed successfully" in install.stdout
    # A playbook outside this repository (no ansible.cfg) finds the role by its name in the collection.
    play = [
        {
            "name": "The installed role",
            "hosts": "localhost",
            "gather_facts": True,
            "tasks": [
                {
                    "name": "Preflight",
                    "ansible.builtin.include_role": {
                        "name": "pathprobe.pathprobe.pathprobe",
                        "tasks_from": "preflight",
                    },
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml", "-e", "pathprobe_region=r1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env | {"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1"},
        cwd=tmp_path,
    )
    # It runs the installed copy: its first check refuses this machine, which has no systemd.
    assert proc.returncode != 0
    assert "TASK [pathprobe.pathprobe.pathprobe : Assert systemd manages the host's services]" in proc.stdout
    assert "pathprobe_service_manage is true but this host's service manager is" in proc.stdout, proc.stdout[-3000:]
