"""What this build of pathprobe is: its version, the git commit it was built from, the Python it runs on.

Both come from git through setuptools-scm when the package is built (exporter/pyproject.toml):
the version from the tags (v0.2.0 gives 0.2.0, a commit after it 0.2.1.devN+g<commit>, a
history with no tag 0.1.devN+g<commit>), the commit, and whether the work tree had uncommitted
changes (the revision then ends in "-dirty"). setuptools-scm writes them to pathprobe/_version.py
in every built package: the wheel and the sdist of `scripts/build.sh`, a wheel built from that
sdist, the Ansible role's wheel of a source checkout, and the image, which has no git and is
given them as build arguments (exporter/Dockerfile). A build or an editable install also leaves
the file beside the sources (git ignores it). Sources imported without either: "0+unknown" and
"unknown".
"""

from __future__ import annotations

import importlib
import platform

UNKNOWN = "unknown"
UNKNOWN_VERSION = "0+unknown"


def stamp() -> tuple[str, str]:
    """(version, revision) as the build wrote them."""
    try:
        module = importlib.import_module("pathprobe._version")
    except ImportError:
        return UNKNOWN_VERSION, UNKNOWN
    version = getattr(module, "VERSION", None)
    node = getattr(module, "NODE", None)
    if not isinstance(version, str) or not version:
        version = UNKNOWN_VERSION
    if not isinstance(node, str) or not node:
        return version, UNKNOWN
    # git's nodes are "g" + the commit; the image's build argument is the commit alone.
    revision = node.removeprefix("g")
    return version, revision + ("-dirty" if getattr(module, "DIRTY", False) is True else "")


VERSION, _REVISION = stamp()


def revision() -> str:
    return _REVISION


def describe() -> str:
    """What `pathprobe --version` prints."""
    return f"pathprobe {VERSION} (revision {_REVISION}, Python {platform.python_version()})"


def labels() -> dict[str, str]:
    """The labels of pathprobe_build_info."""
    return {"version": VERSION, "revision": _REVISION, "python_version": platform.python_version()}
