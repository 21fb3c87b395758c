"""The pages generated from the code stay what it generates: docs/configuration.md from the config
models (scripts/config_reference.py), and it documents every key the example config sets. The
README stays a short page (at most 20 KB, the two commands first, a config and a scrape config that
load) naming every metric family, and every relative link of the documentation resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pathprobe import config

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"
# The pages whose relative links are checked: the README, docs/ and the folders' own pages.
PAGES = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    *(ROOT / folder / "README.md" for folder in ("alerts", "ansible", "mixin", "lab", "exporter")),
    ROOT / "alerts" / "runbook.md",
]


def test_the_configuration_reference_is_what_the_models_generate(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.read_text() == PAGE.read_text(), (
        "docs/configuration.md is not what the config models say: run .venv/bin/python scripts/config_reference.py"
    )


def keys(value: object, path: str = "") -> list[tuple[str, str]]:
    """(section, key) of every key set in a config, lists' items as `section[]`."""
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            found.append((path, str(key)))
            found += keys(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for item in value:
            found += keys(item, f"{path}[]")
    return found


def test_the_reference_documents_every_key_the_example_sets() -> None:
    page = PAGE.read_text()
    sections: dict[str, str] = {}
    for block in re.split(r"^## ", page, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        sections["" if title == "Top level" else title.strip("`")] = body
    example = yaml.safe_load((ROOT / "exporter" / "examples" / "pathprobe.yaml").read_text())
    # Keys of a map-valued setting (price_per_gb's path classes) are values, not keys of a section.
    set_keys = [(s, k) for s, k in keys(example) if s in sections or s.rsplit(".", 1)[0] in sections]
    missing = [f"{s}.{k}" for s, k in set_keys if s in sections and f"- `{k}` (" not in sections[s]]
    assert not missing, missing
    assert len(set_keys) > 40


@pytest.mark.parametrize("page", [ROOT / "exporter" / "README.md", README], ids=["package page", "README"])
def test_the_pages_config_is_a_valid_config(page: Path, tmp_path: Path) -> None:
    block = re.search(r"^## Configure\n.*?```yaml\n(.*?)```", page.read_text(), re.S | re.M)
    assert block, f"{page.relative_to(ROOT)} has no config under Configure"
    assert len(block.group(1).splitlines()) <= 12  # the smallest config, read at a glance
    (tmp_path / "pathprobe.yaml").write_text(block.group(1))
    cfg = config.load(tmp_path / "pathprobe.yaml")
    assert cfg.budget.daily_bytes == 20 * 10**9 and [p.name for p in cfg.peers] == ["osaka-a"]


def test_the_readme_is_a_short_page_that_starts_with_the_two_commands() -> None:
    text = README.read_text()
    size = len(text.encode())
    assert size <= 20_000, f"README.md is {size} bytes: move detail into docs/ and link it (at most 20,000)"
    first = re.search(r"^```sh\n(.*?)^```", text, re.S | re.M)
    assert first and text.index("```") == first.start(), "README.md's first code block is not the commands"
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def test_the_readmes_scrape_config_is_one_prometheus_loads(tmp_path: Path) -> None:
    block = re.search(r"```yaml\n(scrape_configs:.*?)```", README.read_text(), re.S)
    assert block, "README.md has no scrape config"
    scrape = yaml.safe_load(block.group(1))["scrape_configs"][0]
    # The rules and dashboards read the source host's labels from the target.
    assert all({"host", "region", "zone"} <= set(s["labels"]) for s in scrape["static_configs"])
    (tmp_path / "prometheus.yml").write_text(block.group(1))
    check = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def exported_families() -> set[str]:
    """The family names written in the exporter's rooms and its /metrics trailers, as Prometheus
    shows them (a counter with `_total`, an info with `_info`, a summary without `_count`/`_sum`).
    Names built from a prefix at run time are not seen here."""
    src = ROOT / "exporter" / "src" / "pathprobe"
    found: set[str] = set()
    for path in [*(src / "metrics").glob("*.py"), src / "web" / "snapshot.py", src / "webconfig.py"]:
        found |= set(re.findall(r"""(?<=["'])pathprobe_[a-z0-9_]*[a-z0-9](?=["'{ ])""", path.read_text()))
    return {re.sub(r"_(count|sum)$", "", name) for name in found}


def documented(text: str) -> set[str]:
    """Family names a page writes in backticks, a row's `_suffix` shorthand spelt out after every
    prefix of the full name before it (`pathprobe_udp_packets_sent_total`, `_lost_total`)."""
    names: set[str] = set()
    for line in text.splitlines():
        full = ""
        for name in re.findall(r"`(pathprobe_[a-z0-9_]+|_[a-z0-9_]+)`", line):
            if name.startswith("pathprobe_"):
                full = name
                names.add(name)
            elif full:
                parts = full.split("_")
                names |= {"_".join(parts[:i]) + name for i in range(2, len(parts))}
    return names


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "metrics.md"], ids=["README", "metrics.md"])
def test_every_metric_family_is_documented(page: Path) -> None:
    names = documented(page.read_text())
    missing = sorted(
        family for family in exported_families() if not {family, f"{family}_total", f"{family}_info"} & names
    )
    assert not missing, f"{page.relative_to(ROOT)} does not name {missing}: a line in README, a row in docs/metrics.md"


def test_the_readmes_alert_count_is_the_rules() -> None:
    rules = yaml.safe_load((ROOT / "alerts" / "pathprobe.rules.yml").read_text())
    alerts = sum("alert" in rule for group in rules["groups"] for rule in group["rules"])
    assert f"{alerts} alerts" in README.read_text()


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no headings in code
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
