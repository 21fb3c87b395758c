#!/usr/bin/env bash
# The exporter's wheel and sdist, in one command, into dist/ (or the directory given):
#   bash scripts/build.sh [OUT_DIR]
# with the pinned `build` frontend of the dev extra (.venv, or $PYTHON), and the git commit
# baked in as pathprobe_build_info{revision} (pathprobe/_build.py, written for the build and
# removed after it; "-dirty" when the work tree has uncommitted changes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=${1:-$root/dist}
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  revision="$revision-dirty"
fi
stamp=$root/exporter/src/pathprobe/_build.py
trap 'rm -f "$stamp"; rm -rf "$root/exporter/build"' EXIT
printf 'REVISION = "%s"\n' "$revision" > "$stamp"
"$python" -m build --outdir "$out" "$root/exporter"
echo "built $(cd "$out" && ls pathprobe-*) (revision $revision) in $out"
