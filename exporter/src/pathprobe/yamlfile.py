"""Load YAML while remembering the line of every node, so that a validation
error can name `file:line` as well as the field path.

A file that cannot be used is always a `ConfigError` listing its problems (the CLI
exits 2 on it), never another exception, whatever the bytes:

- at most `MAX_BYTES`; UTF-8 only (a UTF-8 byte order mark is allowed), no control
  characters; an empty file is an error;
- nesting at most `MAX_DEPTH` levels, and at most `MAX_NODES` values counted with every
  alias expanded: anchors and aliases (`&a`, `*a`, `<<: *a`) are allowed (Ansible's
  to_nice_yaml writes them for shared values), but a few hundred bytes of aliases to
  aliases that would expand to gigabytes ("billion laughs") stop at the bound, naming
  the line; an alias inside its own anchor (a recursive structure) is refused;
- no explicit tags other than `!!str` (`!!python/...`, `!!binary`, `!!set`, ...);
- a key given twice in one mapping is an error naming both lines (YAML itself would
  keep the last one silently, e.g. a renamed host).

The text is parsed once: the parser's events (libyaml when present) are composed here,
without recursion, into nodes (indexing each node's line on the way), then constructed.
An alias reuses its anchor's node (nothing is copied); values reached through an alias
have no line of their own: errors in them name the alias's line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

MAX_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_PROBLEMS = 100  # listed; the rest are counted
MAX_NODES = 1_500_000  # about 150k peers; worst case (all small values) ~7 s, ~650 MB

# Only the parser (events, no recursion) of these loaders is used; the C one is 3x faster.
_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# YAML's printable set (PyYAML's Reader.NON_PRINTABLE): everything else is refused up front
# so that the message can name the line.
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_STR_TAGS = {None, "!", "tag:yaml.org,2002:str"}


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

    def where(self, loc: Loc) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line else str(self.path)


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The file as text, or a ConfigError saying plainly why not."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > max_bytes:
                raise ConfigError([f"{path}: larger than {max_bytes} bytes; not a configuration file?"])
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    if len(raw) > max_bytes:
        raise ConfigError([f"{path}: larger than {max_bytes} bytes; not a configuration file?"])
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError([f"{path}: is UTF-16 (or UTF-32) text; save it as UTF-8"])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            [f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); is this a binary file?"]
        ) from exc
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise ConfigError([f"{path}:{line}: control character U+{ord(bad.group()):04X} is not allowed in YAML"])
    return text


class _Refused(Exception):
    def __init__(self, mark: Any, problem: str):
        super().__init__(problem)
        self.mark, self.problem = mark, problem


@dataclass
class _Open:
    """A collection being composed."""

    node: SequenceNode | MappingNode
    loc: Loc | None  # None: inside a mapping key (not indexed)
    start: int  # values counted (aliases expanded) before this collection
    anchor: str | None = None
    key: Node | None = None  # a mapping's key waiting for its value
    seen: dict[Any, int] | None = None  # a mapping's constructed scalar keys -> line


def _compose(loader: Any, lines: dict[Loc, int], duplicates: list[tuple[int, str]]) -> Node | None:
    """The single document's node tree, from the parser's events, without recursion."""
    return _Composer(loader, lines, duplicates).compose()


class _Composer:
    """Composes one document event by event with a stack of open collections (no recursion),
    counting the values it holds with aliases expanded, and its depth, as it goes."""

    def __init__(self, loader: Any, lines: dict[Loc, int], duplicates: list[tuple[int, str]]):
        self.loader, self.lines, self.duplicates = loader, lines, duplicates
        self.stack: list[_Open] = []
        self.anchors: dict[str, tuple[Node, int]] = {}  # name -> (node, values it holds with aliases expanded)
        self.count = 0  # values so far, aliases expanded

    def compose(self) -> Node | None:
        loader = self.loader
        loader.get_event()  # StreamStartEvent
        if loader.check_event(StreamEndEvent):
            return None
        loader.get_event()  # DocumentStartEvent
        while True:
            event: Event = loader.get_event()
            mark: Any = event.start_mark
            loc = _loc_of_next(self.stack)
            if loc is not None and isinstance(event, (AliasEvent, ScalarEvent, CollectionStartEvent)):
                self.lines.setdefault(loc, mark.line + 1)
            if isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                self._open(event, mark, loc)
                continue
            node = self._node(event, mark)
            if not self.stack:
                break
            self._attach(self.stack[-1], node, mark.line + 1)
        loader.get_event()  # DocumentEndEvent
        if not loader.check_event(StreamEndEvent):
            raise _Refused(loader.get_event().start_mark, "more than one YAML document (---) in this file")
        return node

    def _counted(self, mark: Any, n: int, what: str = "values") -> None:
        self.count += n
        if self.count > MAX_NODES:
            raise _Refused(mark, f"more than {MAX_NODES} {what}")

    def _open(self, event: SequenceStartEvent | MappingStartEvent, mark: Any, loc: Loc | None) -> None:
        self._counted(mark, 1)
        if event.tag not in (None, "!"):
            raise _Refused(mark, f"the tag {event.tag} is not allowed in this file")
        if len(self.stack) >= MAX_DEPTH:
            raise _Refused(mark, f"nested deeper than {MAX_DEPTH} levels")
        kind = SequenceNode if isinstance(event, SequenceStartEvent) else MappingNode
        node = kind(self.loader.resolve(kind, None, event.implicit), [], mark, None, flow_style=event.flow_style)
        self.stack.append(_Open(node, loc, self.count - 1, event.anchor, seen=None if kind is SequenceNode else {}))

    def _node(self, event: Event, mark: Any) -> Node:
        """The node that an alias, a scalar or the end of a collection completes."""
        if isinstance(event, AliasEvent):
            if event.anchor not in self.anchors:
                inside = any(frame.anchor == event.anchor for frame in self.stack)
                why = "inside its own anchor (a recursive structure)" if inside else "has no anchor before it"
                raise _Refused(mark, f"alias *{event.anchor} {why}")
            node, size = self.anchors[event.anchor]
            self._counted(mark, size, "values with aliases expanded")
            return node
        if isinstance(event, ScalarEvent):
            self._counted(mark, 1)
            node = _scalar(self.loader, event, mark)
            if event.anchor is not None:
                self.anchors[event.anchor] = (node, 1)
            return node
        if isinstance(event, (SequenceEndEvent, MappingEndEvent)):
            frame = self.stack.pop()
            if frame.anchor is not None:
                self.anchors[frame.anchor] = (frame.node, self.count - frame.start)
            return frame.node
        raise _Refused(mark, f"unexpected {type(event).__name__}")  # the parser guarantees the order of events

    def _attach(self, top: _Open, node: Node, line: int) -> None:
        """Add a finished node (`line`: where it started, or its alias) to the collection being composed."""
        if isinstance(top.node, SequenceNode):
            top.node.value.append(node)
        elif top.key is None:
            top.key = node
            if isinstance(node, ScalarNode) and node.tag != "tag:yaml.org,2002:merge":
                if top.loc is not None:
                    self.lines.setdefault((*top.loc, node.value), line)  # a field's line is its key's
                _check_duplicate(self.loader.construct_object(node), line, top, node, self.duplicates)
        else:
            top.node.value.append((top.key, node))
            top.key = None


def _scalar(loader: Any, event: ScalarEvent, mark: Any) -> ScalarNode:
    if event.tag not in _STR_TAGS:
        raise _Refused(mark, f"the tag {event.tag} is not allowed in this file")
    tag = event.tag if event.tag not in (None, "!") else loader.resolve(ScalarNode, event.value, event.implicit)
    if tag == "tag:yaml.org,2002:value":  # a bare '=': nothing in SafeLoader constructs it
        tag = "tag:yaml.org,2002:str"
    node = ScalarNode(tag, event.value, mark, None, style=event.style)
    if tag == "tag:yaml.org,2002:merge":  # '<<': flatten_mapping merges the value, there is nothing to construct
        return node
    try:  # constructed now (and cached for the document) so that an error names its line
        loader.construct_object(node)
    except ValueError as exc:  # 2024-13-45, an int of 5,000 digits
        kind = tag.rsplit(":", 1)[-1]
        why = str(exc).split(";")[0]
        raise _Refused(mark, f"{_short(event.value)!r} is not a valid {kind}: {why}") from exc
    return node


def _loc_of_next(stack: list[_Open]) -> Loc | None:
    """The field path of the node about to start; None: a mapping key or inside one (not indexed)."""
    if not stack:
        return ()
    parent = stack[-1]
    if parent.loc is None:
        return None
    if isinstance(parent.node, MappingNode):
        if parent.key is None:
            return None
        return (*parent.loc, parent.key.value) if isinstance(parent.key, ScalarNode) else None
    return (*parent.loc, len(parent.node.value))


def _check_duplicate(key: Any, line: int, top: _Open, node: Node, duplicates: list[tuple[int, str]]) -> None:
    assert top.seen is not None
    try:
        first = top.seen.get(key)
        if first is None:
            top.seen[key] = line
            return
    except TypeError:  # not hashable: construction refuses it with its own message
        return
    duplicates.append((line, f"key {_short(key)!r} given twice (first on line {first})"))


def _short(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _where(path: Path, mark: Any) -> str:
    return f"{path}:{mark.line + 1}" if mark is not None else str(path)


def load(path: str | Path) -> YamlDoc:
    path = Path(path)
    text = read_text(path)
    loader = _Loader(text)
    lines: dict[Loc, int] = {}
    duplicates: list[tuple[int, str]] = []
    try:
        node = _compose(loader, lines, duplicates)
        if duplicates:
            found = [f"{path}:{line}: {problem}" for line, problem in duplicates[:MAX_PROBLEMS]]
            if len(duplicates) > MAX_PROBLEMS:
                found.append(f"{path}: ... and {len(duplicates) - MAX_PROBLEMS} more keys given twice")
            raise ConfigError(found)
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise ConfigError([f"{_where(path, exc.mark)}: {exc.problem}"]) from exc
    except yaml.MarkedYAMLError as exc:  # syntax, or a value that cannot be constructed
        what = "YAML" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax"
        raise ConfigError([f"{_where(path, exc.problem_mark)}: {what}: {exc.problem}"]) from exc
    except RecursionError as exc:  # merge keys (<<) chained through many anchors, flattened recursively
        raise ConfigError([f"{path}: merge keys (<<) chained too deep"]) from exc
    except yaml.YAMLError as exc:  # e.g. ReaderError: no line, only a position
        raise ConfigError([f"{path}: YAML: {_short(exc, 200)}"]) from exc
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError([f"{path}: empty (no YAML document in it)"])
    return YamlDoc(path, data, lines)


def _format_loc(loc: Loc) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def validate(doc: YamlDoc, model: type[M]) -> M:
    """Validate a loaded document; every error names file:line and field path."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        errors = exc.errors()
        for err in errors[:MAX_PROBLEMS]:
            loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{doc.where(loc)}: {_format_loc(loc)}: {msg}")
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"{doc.path}: ... and {len(errors) - MAX_PROBLEMS} more problems")
        raise ConfigError(problems) from exc


def file_problem(path: Path) -> str | None:
    """Why a file a configuration names cannot be read, or None: it exists, is a
    regular file and this process can open it for reading."""
    try:
        with open(path, "rb"):
            pass
    except IsADirectoryError:
        return f"{path} is a directory, not a file"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    except ValueError as exc:  # a NUL in the name
        return f"cannot read {_short(path)}: {exc}"
    if not path.is_file():
        return f"{path} is not a regular file"
    return None


Check = Callable[[M], list[tuple[Loc, str]]]


def load_model(path: str | Path, model: type[M], check: Check[M] | None = None) -> M:
    """Load and validate; `check` (optional) looks beyond the file (e.g. at the files it
    names) and returns (field path, problem) pairs, reported with file:line like the rest."""
    doc = load(path)
    obj = validate(doc, model)
    if check is not None:
        found = check(obj)
        if found:
            raise ConfigError([f"{doc.where(loc)}: {_format_loc(loc)}: {problem}" for loc, problem in found])
    return obj
