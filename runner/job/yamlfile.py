"""Reading a job YAML safely, remembering the line of every key.

PyYAML's ``SafeLoader`` does the scanning and parsing; composition and construction
are ours so that:

* every key (and every list item) has its 1-based line, keyed by its path
  (``("train", "lr")``, ``("train", "betas", 1)``), so any error can say ``file:line``;
* a key given twice at any depth is an error naming both lines (PyYAML silently keeps
  the last one);
* anchors and aliases are refused outright, which makes "billion laughs" impossible;
* nesting deeper than :data:`MAX_DEPTH` is refused (no RecursionError);
* ``1e-3`` is a float, as in YAML 1.2 (PyYAML's 1.1 rules make it a string).

Problems come back as :class:`YamlProblem` (line, column, message); the caller adds
the file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 1 << 20  # a job file is a page of text; anything bigger is a mistake
MAX_DEPTH = 32

Path_ = tuple[str | int, ...]
_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"


@dataclass(frozen=True)
class YamlProblem(Exception):
    line: int  # 1-based; 0 when unknown
    column: int  # 1-based; 0 when unknown
    message: str


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases and deep nesting while composing."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, AliasEvent) or (
            isinstance(event, ScalarEvent | SequenceStartEvent | MappingStartEvent)
            and event.anchor is not None
        ):
            mark = event.start_mark
            raise YamlProblem(mark.line + 1, mark.column + 1,
                              "YAML anchors and aliases are not allowed (hint: write the "
                              "value out in full)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = event.start_mark
                raise YamlProblem(mark.line + 1, mark.column + 1,
                                  f"nesting deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.2 floats without a dot ("1e-3", "3E+4"); PyYAML's 1.1 resolver leaves them strings.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _problem_from(err: yaml.YAMLError) -> YamlProblem:
    if isinstance(err, yaml.reader.ReaderError):
        return YamlProblem(0, 0, f"not a text file: {err.reason} at byte {err.position}")
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    text = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
    if "\\t" in text:
        text += " (hint: indent with spaces, not tabs)"
    if mark is None:
        return YamlProblem(0, 0, text)
    return YamlProblem(mark.line + 1, mark.column + 1, text)


def parse(text: str) -> tuple[Any, dict[Path_, int]]:
    """YAML text -> (plain data, line of every key/item by path). Raises YamlProblem."""
    try:
        loader = _Loader(text)
    except yaml.YAMLError as err:
        raise _problem_from(err) from None
    try:
        root = loader.get_single_node()
        lines: dict[Path_, int] = {(): 1}
        data = None if root is None else _build(loader, root, (), lines)
    except yaml.YAMLError as err:
        problem = _problem_from(err)
        lines_of_text = text.splitlines()
        if 0 < problem.line <= len(lines_of_text) and "${" in lines_of_text[problem.line - 1]:
            problem = YamlProblem(problem.line, problem.column, problem.message +
                                  " (hint: quote a ${VAR} value inside { } or [ ])")
        raise problem from None
    finally:
        loader.dispose()
    return data, lines


def parse_scalar(text: str) -> Any:
    """One ``--set`` value: a YAML scalar (or flow list/mapping). Raises YamlProblem."""
    data, _ = parse(text)
    return "" if data is None and text.strip() == "" else data


def _build(loader: _Loader, node: Node, path: Path_, lines: dict[Path_, int]) -> Any:
    if isinstance(node, ScalarNode):
        try:
            return loader.construct_object(node, deep=True)
        except ValueError:  # Python refuses to read an integer of over 4,300 digits
            mark = node.start_mark
            raise YamlProblem(mark.line + 1, mark.column + 1,
                              f"a number of {len(str(node.value))} characters: no job "
                              "value needs one") from None
    if node.tag not in (_SEQ, _MAP):
        mark = node.start_mark
        raise YamlProblem(mark.line + 1, mark.column + 1,
                          f"YAML tag {node.tag!r} is not allowed (plain lists and mappings only)")
    if isinstance(node, SequenceNode):
        items = []
        for i, child in enumerate(node.value):
            lines[path + (i,)] = child.start_mark.line + 1
            items.append(_build(loader, child, path + (i,), lines))
        return items
    assert isinstance(node, MappingNode)
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            raise YamlProblem(line, key_node.start_mark.column + 1,
                              "keys must be plain names (no lists, mappings or '<<' merges)")
        key = str(key_node.value)  # the text as written: "on", "yes", "1" stay names
        if key in out:
            dotted = ".".join(str(p) for p in path + (key,))
            raise YamlProblem(line, key_node.start_mark.column + 1,
                              f"duplicate key {dotted!r} (first given on line "
                              f"{lines[path + (key,)]})")
        lines[path + (key,)] = line
        out[key] = _build(loader, value_node, path + (key,), lines)
    return out
