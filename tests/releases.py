"""Releases made as scripts/build.sh makes them, from a clone of this repository's HEAD with an
empty commit of its own, tagged (two releases differ in their commit as well as their version):
what the artifact, collection and upgrade tests install."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
GIT = ["git", "-c", "user.name=pathprobe tests", "-c", "user.email=tests@pathprobe.invalid"]


def pip_settings() -> dict[str, str]:
    """The pip settings of this environment (an index mirror, a certificate, a directory of wheels):
    what pip on the controller uses, the builds' isolated environments as much as the role's downloads."""
    return {k: v for k, v in os.environ.items() if k.startswith("PIP_")}


@dataclass(frozen=True)
class Release:
    dist: Path
    version: str  # the exporter's (PEP 440)
    revision: str  # the commit it was built from

    @property
    def wheel(self) -> Path:
        return self.dist / f"pathprobe-{self.version}-py3-none-any.whl"

    @property
    def collection(self) -> Path:
        return next(self.dist.glob("pathprobe-pathprobe-*.tar.gz"))


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def release(work: Path, tag: str) -> Release:
    """A clone of HEAD in work/clone, an empty commit of its own tagged `tag`, built into work/dist."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    git(clone, "commit", "-q", "--allow-empty", "-m", f"release {tag}")
    git(clone, "tag", tag)
    env = {
        "PYTHON": sys.executable,
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(work)),
    } | pip_settings()
    proc = subprocess.run(
        ["bash", str(clone / "scripts" / "build.sh"), str(work / "dist")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Release(work / "dist", tag.removeprefix("v"), git(clone, "rev-parse", "HEAD"))
