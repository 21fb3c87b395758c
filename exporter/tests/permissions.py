"""A file its reader may not open, as it is for a user without permission, root included."""

import builtins
import os
from pathlib import Path
from typing import Any

import pytest


def unreadable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """`path` without read permission; as root, who reads any file, open() of it fails as it
    would for anyone else (the permission error at open())."""
    path.chmod(0)
    if os.geteuid() != 0:
        return
    real = builtins.open

    def guarded(file: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
