#!/usr/bin/env bash
# A release's artifacts, in one command, into dist/ (or the directory given):
#   bash scripts/build.sh [OUT_DIR]
#   pathprobe-VERSION-py3-none-any.whl, pathprobe-VERSION.tar.gz   the exporter's wheel and sdist
#   pathprobe-monitoring-VERSION.tar.gz   rules, Alertmanager config, runbook, dashboards, mixin
#   pathprobe-pathprobe-VERSION.tar.gz    the Ansible collection (the role), for ansible-galaxy
#   SHA256SUMS                            of the four, as `sha256sum -c SHA256SUMS` reads them
# VERSION comes from git through setuptools-scm (a tag v0.2.0 gives 0.2.0, a commit after it
# 0.2.1.devN+g<commit>; the collection's is its semantic-version spelling, 0.2.1-dev.N+g<commit>),
# and so does the revision the wheel reports (pathprobe/build.py). Built with the pinned `build`
# frontend and Ansible of the dev extra (.venv, or $PYTHON). Everything is made in a scratch
# directory and moved into OUT_DIR once all of it is made: a failed build leaves nothing there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=${1:-$root/dist}
collection=$root/ansible/collections/ansible_collections/pathprobe/pathprobe
mkdir -p "$out"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d "$out/.build.XXXXXX")
# setuptools' own scratch directory is removed too: a module deleted from src/ would stay in it.
trap 'rm -rf "$scratch" "$root/exporter/build"' EXIT

version=$(cd "$root/exporter" && "$python" -m setuptools_scm)
"$python" -m build --outdir "$scratch" "$root/exporter"
wheel=$(cd "$scratch" && ls pathprobe-*.whl)
[ "$wheel" = "pathprobe-$version-py3-none-any.whl" ] || {
  echo "build.sh: built $wheel, but setuptools-scm says the version is $version" >&2
  exit 1
}

# The monitoring side, as the repository has it (the rules rendered with the default parameters;
# alerts/README.md says how to render them for a fleet's own).
bundle=$scratch/pathprobe-monitoring-$version
mkdir -p "$bundle/alerts" "$bundle/dashboards" "$bundle/mixin"
cp "$root"/alerts/{pathprobe.rules.yml,alertmanager.yml,runbook.md,README.md} "$bundle/alerts/"
cp -r "$root/dashboards/json" "$root/dashboards/provisioning" "$bundle/dashboards/"
rm -f "$bundle/dashboards/json/.lint"
# The mixin is its directory alone (config, rules and dashboards as jsonnet, scripts/mixin.py's).
cp "$root"/mixin/{mixin.libsonnet,config.libsonnet,rules.libsonnet,dashboards.libsonnet,jsonnetfile.json,README.md} \
  "$bundle/mixin/"
tar -C "$scratch" --sort=name --owner=0 --group=0 --numeric-owner -czf "$bundle.tar.gz" "$(basename "$bundle")"
rm -r "$bundle"

# The collection at the release's version: galaxy.yml holds a placeholder, set here.
semver=$("$python" - "$version" <<'EOF'
import sys

from packaging.version import Version

v = Version(sys.argv[1])
text = ".".join(str(n) for n in (*v.release, 0, 0)[:3])
pre = ([f"{v.pre[0]}.{v.pre[1]}"] if v.pre else []) + ([f"dev.{v.dev}"] if v.dev is not None else [])
local = ([f"post.{v.post}"] if v.post is not None else []) + ([v.local] if v.local else [])
print(text + ("-" + ".".join(pre) if pre else "") + ("+" + ".".join(local) if local else ""))
EOF
)
cp -r "$collection" "$scratch/collection"
sed -i "s/^version: .*/version: $semver/" "$scratch/collection/galaxy.yml"
"$(dirname "$python")/ansible-galaxy" collection build --output-path "$scratch" "$scratch/collection" > /dev/null
rm -r "$scratch/collection"

(cd "$scratch" && sha256sum -- *.whl *.tar.gz > SHA256SUMS)
for artifact in "$scratch"/*.whl "$scratch"/*.tar.gz "$scratch/SHA256SUMS"; do
  mv -f "$artifact" "$out/"
done
echo "built pathprobe $version (collection $semver) in $out:"
(cd "$out" && cat SHA256SUMS)
