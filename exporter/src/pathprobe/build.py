"""What this build of pathprobe is: its version, the git commit it was built from, the Python it runs on.

The revision is baked in at build time: `scripts/build.sh` (the wheel and sdist) and the
exporter's Dockerfile (build argument REVISION) write it to `pathprobe/_build.py` before the
package is built. A checkout installed in place (`pip install -e`) has no such file: "unknown".
"""

from __future__ import annotations

import importlib
import platform

from . import __version__

UNKNOWN = "unknown"


def revision() -> str:
    try:
        module = importlib.import_module("pathprobe._build")
    except ImportError:
        return UNKNOWN
    value = getattr(module, "REVISION", "")
    return value if isinstance(value, str) and value else UNKNOWN


def labels() -> dict[str, str]:
    """The labels of pathprobe_build_info."""
    return {"version": __version__, "revision": revision(), "python_version": platform.python_version()}
