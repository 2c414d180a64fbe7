"""``JobError`` and the one-line messages it carries.

Every line reads ``FILE:LINE dotted.path: what is wrong, got VALUE (hint)`` or, for a
value that came from ``--set``, ``--set dotted.path: ...``. Values that came from the
environment, or sit under a secret-looking name, are described by type, never shown.
Whatever the input, output stays readable: values and keys are cut to
:data:`MAX_SHOWN_CHARS`, and at most :data:`MAX_PROBLEMS` lines are listed.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

Path_ = tuple[str | int, ...]

# A 1 MB value or 20,000 unknown keys must still give a screenful, not a flood: the
# first problems are the ones to fix, and a value is recognisable from its start.
MAX_SHOWN_CHARS = 80
MAX_PROBLEMS = 20

MISSING_HINTS = {
    "name": "a slug like 'tiny-cpu'",
    "model": "e.g. model: {arch: ten, preset: tiny}",
    "model.preset": "one of tiny, small, small_32k, medium, large; see `ten-runner presets`",
    "data": "e.g. data: {dataset: builtin:botocore-docs}",
    "data.dataset": "a known name such as finewebedu, a local path or glob, or "
                    "builtin:botocore-docs",
    "train": "e.g. train: {max_steps: 300}",
}
_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "dict_type": "a mapping", "tuple_type": "a list",
    "list_type": "a list",
}
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="),
           "less_than": ("lt", "<"), "less_than_equal": ("le", "<=")}


class JobError(Exception):
    """A job that cannot run as written: one line per problem (see module docstring)."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        part = part if isinstance(part, int) else shorten(str(part), 40)  # keys can be huge
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# Words users reach for that name one of the choices by another name.
SYNONYMS = {"gpu": "cuda", "nvidia": "cuda", "bfloat16": "bf16", "float16": "fp16",
            "half": "fp16", "float32": "fp32", "full": "fp32", "adam": "adamw"}


def suggest(word: str, choices: typing.Iterable[str]) -> str | None:
    """The closest choice ("max_step" -> "max_steps", "vocab" -> "vocab_size", "gpu" ->
    "cuda"), if any."""
    choices = list(choices)
    if SYNONYMS.get(word.lower()) in choices:
        return SYNONYMS[word.lower()]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.7)
    if close:
        return close[0]
    contains = [c for c in choices if len(word) >= 3 and (word in c or c in word)]
    return contains[0] if len(contains) == 1 else None


def show(value: Any) -> str:
    """A short rendering of a (non-secret) value for 'got ...'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return shorten(repr(value), 60)


def describe_hidden(value: Any, written: str | None) -> str:
    kind = type(value).__name__
    return f"a value of type {kind}" + (f" (from {written})" if written else "")


def section_fields(schema: type[BaseModel], path: Path_) -> list[str] | None:
    """The keys allowed at ``path`` (a mapping in the schema), or None if it is not one."""
    cls: Any = schema
    for part in path:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
        info = cls.model_fields.get(part) if isinstance(part, str) else None
        if info is None:
            return None
        cls = _unwrap(info.annotation)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return None


def _unwrap(annotation: Any) -> Any:
    """``Section | None`` -> ``Section``; anything else unchanged."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def describe(err: Mapping[str, Any], schema: type[BaseModel], hidden: str | None) -> str:
    """One pydantic error -> 'what is wrong, got X (hint)'. ``hidden`` replaces the value."""
    kind, ctx = err["type"], err.get("ctx") or {}
    got = hidden if hidden is not None else show(err.get("input"))
    if kind in _DESCRIBE:
        return _DESCRIBE[kind](err, schema, hidden, got)
    if kind in _TYPE_WORDS:
        return _wrong_type(err, hidden, got)
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        return f"must be {op} {ctx.get(key)}, got {got}"
    return f"{err['msg']}, got {got}"


def _missing(err: Mapping[str, Any], schema: Any, hidden: str | None, got: str) -> str:
    loc = tuple(err["loc"])
    if loc and isinstance(loc[-1], int):
        return "expected 2 numbers, e.g. [0.9, 0.95]" if loc[-2:-1] == ("betas",) \
            else "too few items"
    hint = MISSING_HINTS.get(dotted(loc))
    return "required field is missing" + (f" (hint: {hint})" if hint else "")


def _unknown_key(err: Mapping[str, Any], schema: Any, hidden: str | None, got: str) -> str:
    loc = tuple(err["loc"])
    return unknown_key(schema, loc[:-1], str(loc[-1]))


def unknown_key(schema: type[BaseModel], section: Path_, key: str) -> str:
    """What to say about ``key``, which ``section`` does not hold: the sub-section it
    belongs in (``resources.instance_type`` lives in ``resources.aws``), else the closest
    known key, else every known key."""
    known = section_fields(schema, section) or []
    inner = [k for k in known if key in (section_fields(schema, (*section, k)) or ())]
    if inner:
        return (f"unknown key {show(key)} here (it belongs in "
                f"{dotted((*section, inner[0]))}: {{{key}: ...}})")
    close = suggest(key, known)
    return f"unknown key {show(key)}" + (f" (did you mean {close!r}?)" if close else
                                      f" (allowed: {', '.join(known)})")


def _not_an_option(err: Mapping[str, Any], schema: Any, hidden: str | None, got: str) -> str:
    value = err.get("input")
    expected = str((err.get("ctx") or {}).get("expected", ""))
    options = [o.strip("'") for o in expected.replace(" or ", ", ").split(", ")]
    close = suggest(value, options) if isinstance(value, str) and hidden is None else None
    return (f"expected one of {', '.join(options)}, got {got}"
            + (f" (did you mean {close!r}?)" if close else ""))


def _job_rule(err: Mapping[str, Any], schema: Any, hidden: str | None, got: str) -> str:
    """An error from the schema's own validators (``schema.job_error``), with its hint."""
    ctx = err.get("ctx") or {}
    text = str(err["msg"])
    if ctx.get("show_value", True):
        text += f", got {got}"
    return text + (f" (hint: {ctx['hint']})" if ctx.get("hint") and hidden is None else "")


def _wrong_type(err: Mapping[str, Any], hidden: str | None, got: str) -> str:
    kind = err["type"]
    hint = MISSING_HINTS.get(dotted(tuple(err["loc"]))) \
        if _TYPE_WORDS[kind] == "a mapping" else None
    if hidden is not None and "(from " in hidden and kind != "string_type":
        hint = "a ${VAR} is always text; write numbers and true/false in the file"
    return f"expected {_TYPE_WORDS[kind]}, got {got}" + (f" (hint: {hint})" if hint else "")


_DESCRIBE: dict[str, Callable[[Mapping[str, Any], Any, str | None, str], str]] = {
    "missing": _missing,
    "extra_forbidden": _unknown_key,
    "literal_error": _not_an_option,
    "job": _job_rule,
    "finite_number": lambda err, schema, hidden, got: f"expected a finite number, got {got}",
    "string_too_short": lambda err, schema, hidden, got: "must not be empty",
    "too_long": lambda err, schema, hidden, got: (
        f"expected {err['ctx'].get('max_length')} items, got {err['ctx'].get('actual_length')}"),
}


@dataclass
class Problems:
    """Collects (path, message) pairs and formats them with file:line or --set."""

    source: str
    lines: dict[Path_, int] = field(default_factory=dict)
    overrides: set[Path_] = field(default_factory=set)
    secrets: list[str] = field(default_factory=list)
    items: list[tuple[tuple[int, int], str]] = field(default_factory=list)

    def add(self, path: Path_, message: str) -> None:
        for n in range(len(path), 0, -1):
            if path[:n] in self.overrides:
                self.items.append(((1, 0), f"--set {dotted(path)}: {message}"))
                return
        line = next(self.lines[path[:n]] for n in range(len(path), -1, -1)
                    if path[:n] in self.lines) if self.lines else 1
        self.items.append(((0, line), f"{shorten(self.source, 200)}:{line} {dotted(path)}: "
                                      f"{message}"))

    def add_line(self, line: int, text: str) -> None:
        """A problem with no field path (YAML syntax, the file itself)."""
        self.items.append(((0, line), text))

    def __bool__(self) -> bool:
        return bool(self.items)

    def error(self) -> JobError:
        """The problems in file order, without repeats, at most :data:`MAX_PROBLEMS` of
        them, then one line counting the rest."""
        from runner.job.secrets import scrubber

        clean = scrubber(self.secrets)
        seen: set[str] = set()  # a set: 20,000 problems must not take n² time
        lines: list[str] = []
        for _, text in sorted(self.items, key=lambda item: item[0]):
            text = clean(text)
            if text not in seen:
                seen.add(text)
                lines.append(text)
        if len(lines) > MAX_PROBLEMS:
            rest = len(lines) - MAX_PROBLEMS
            lines = lines[:MAX_PROBLEMS] + [
                f"{shorten(self.source)}: ... and {rest:,} more problem{'s' * (rest > 1)} "
                "(fix the ones above, then validate again)"]
        return JobError(lines)
