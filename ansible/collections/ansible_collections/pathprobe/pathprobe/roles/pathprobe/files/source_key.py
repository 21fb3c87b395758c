"""The key of an exporter source tree on the controller: a SHA-256 over the files its wheel is
made of (pyproject.toml, setup.cfg, README.md, an sdist's PKG-INFO, and everything under src/
but caches, egg-info and the version file a build writes there), their paths and contents. The
role builds the wheel once per key: a changed tree again, an unchanged one not.

    python source_key.py EXPORTER_DIR     prints the key's first 16 hex digits
"""

import hashlib
import sys
from pathlib import Path

TOP = ("pyproject.toml", "setup.cfg", "README.md", "PKG-INFO")
GENERATED = ("__pycache__", ".egg-info", "_version.py", ".pyc")


def files(tree: Path) -> list[Path]:
    found = [tree / name for name in TOP if (tree / name).is_file()]
    for path in sorted((tree / "src").rglob("*")):
        if path.is_file() and not any(part.endswith(GENERATED) for part in path.relative_to(tree).parts):
            found.append(path)
    return found


def main() -> None:
    tree = Path(sys.argv[1])
    if not (tree / "pyproject.toml").is_file() or not (tree / "src").is_dir():
        sys.exit(f"pathprobe_source_dir {tree}: not the exporter's source (no pyproject.toml and src/ there)")
    digest = hashlib.sha256()
    for path in files(tree):
        digest.update(f"{path.relative_to(tree).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    print(digest.hexdigest()[:16])


if __name__ == "__main__":
    main()
