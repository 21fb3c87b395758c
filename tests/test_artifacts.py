"""What is released: scripts/build.sh makes the wheel and the sdist in one command, with the git
commit baked in for pathprobe_build_info{revision}, and leaves the source tree as it was."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_build_makes_the_wheel_and_sdist_with_the_revision(tmp_path: Path) -> None:
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build.sh"), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, check=False, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    wheel = next(tmp_path.glob("pathprobe-*-py3-none-any.whl"))
    with zipfile.ZipFile(wheel) as whl:
        baked = whl.read("pathprobe/_build.py").decode()
        assert "pathprobe/webconfig.py" in whl.namelist()
    assert baked.startswith(f'REVISION = "{head.stdout.strip()}')
    sdist = next(tmp_path.glob("pathprobe-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        assert any(name.endswith("src/pathprobe/_build.py") for name in tar.getnames())
    assert not (ROOT / "exporter" / "src" / "pathprobe" / "_build.py").exists()  # written for the build only
