"""Load YAML while remembering the line of every node, so that a validation
error can name `file:line` as well as the field path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """A file that cannot be used; `problems` holds one line per error."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class YamlDoc:
    path: Path
    data: Any
    lines: dict[Loc, int]  # field path -> 1-based line

    def line_of(self, loc: Loc) -> int | None:
        # Walk up until a located node is found (a missing key has no line;
        # its parent mapping does).
        while True:
            if loc in self.lines:
                return self.lines[loc]
            if not loc:
                return None
            loc = loc[:-1]


def _index(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*loc, str(key.value))
            _index(value, child, lines)
            lines[child] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, (*loc, i), lines)


def load(path: str | Path) -> YamlDoc:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError([f"{where}: YAML syntax: {exc.problem}"]) from exc
    lines: dict[Loc, int] = {}
    if node is not None:
        _index(node, (), lines)
    return YamlDoc(path, data if data is not None else {}, lines)


def _format_loc(loc: Loc) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def validate(doc: YamlDoc, model: type[M]) -> M:
    """Validate a loaded document; every error names file:line and field path."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
            line = doc.line_of(loc)
            where = f"{doc.path}:{line}" if line else str(doc.path)
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {_format_loc(loc)}: {msg}")
        raise ConfigError(problems) from exc


def load_model(path: str | Path, model: type[M]) -> M:
    return validate(load(path), model)
