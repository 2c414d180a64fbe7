"""``${VAR}`` substitution and redaction: resolved secrets never leave the process.

Any string value may hold ``${VAR}`` or ``${VAR:-default}`` (``$${`` writes a literal
``${``). Substitution records, per field path, the text as written; redaction puts that
text back, and also hides any field whose *name* looks secret (``api_key``,
``secret_access_key``, ``hf_token``, ``password``) even when written literally.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

Path_ = tuple[str | int, ...]
REDACTED = "***"

_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$", re.S)
_SECRET_WORDS = {"key", "secret", "token", "password", "passwd", "credential", "credentials",
                 "apikey", "auth"}


class EnvProblem(Exception):
    def __init__(self, path: Path_, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def looks_secret(key: str | int) -> bool:
    """``hf_token`` and ``aws_secret_access_key`` do; ``max_tokens`` and ``tokenizer`` don't."""
    return isinstance(key, str) and bool(_SECRET_WORDS & set(re.split(r"[_\-.]", key.lower())))


def _substitute(text: str, path: Path_, env: Mapping[str, str], used: list[str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        ref = _NAME.match(match.group(1))
        if ref is None:
            raise EnvProblem(path, f"malformed environment reference {match.group(0)!r} "
                             "(hint: write ${NAME} or ${NAME:-default})")
        name, default = ref.group(1), ref.group(2)
        if name in env:
            used.append(env[name])
            return env[name]
        if default is not None:
            return default
        raise EnvProblem(path, f"environment variable {name} is not set "
                         f"(hint: export {name}=... or write ${{{name}:-default}})")

    return _REF.sub(one, text)


def references(data: Any) -> list[str]:
    """The variable names the string values of ``data`` refer to, sorted: what a machine
    that loads the same job file (``submit`` to a remote host) must be given. ``$${``
    escapes are skipped; a malformed reference is left to :func:`substitute` to report."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and "${" in value:
            for match in _REF.finditer(value):
                ref = _NAME.match(match.group(1)) if match.group(0) != "$${" else None
                if ref is not None:
                    names.add(ref.group(1))

    walk(data)
    return sorted(names)


def substitute(data: Any, env: Mapping[str, str],
               path: Path_ = ()) -> tuple[Any, dict[Path_, str], list[str], list[EnvProblem]]:
    """Replace references in every string value; returns (data, {path: text as written},
    the environment values used, problems). Keys are never substituted."""
    written: dict[Path_, str] = {}
    used: list[str] = []
    problems: list[EnvProblem] = []

    def walk(value: Any, here: Path_) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, here + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, here + (i,)) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            try:
                resolved = _substitute(value, here, env, used)
            except EnvProblem as problem:
                problems.append(problem)
                return value
            if _REF.search(value.replace("$${", "")):
                written[here] = value
            return resolved
        return value

    return walk(data, path), written, used, problems


def redact(data: Any, written: Mapping[Path_, str], path: Path_ = ()) -> Any:
    """A copy of ``data`` with substituted fields shown as written and secret-named
    fields hidden."""
    if path in written:
        return written[path]
    if path and looks_secret(path[-1]) and data is not None:
        return REDACTED
    if isinstance(data, dict):
        return {k: redact(v, written, path + (k,)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v, written, path + (i,)) for i, v in enumerate(data)]
    return data


def sensitive(path: Path_, written: Mapping[Path_, str]) -> bool:
    """Whether an error about this field must not show its value."""
    return path in written or any(looks_secret(p) for p in path)


def literal_secrets(data: Any, path: Path_ = ()) -> list[str]:
    """String values written literally under a secret-looking name (``api_token: abc``):
    :func:`redact` hides them in dumps, and they are scrubbed from text like env values."""
    if isinstance(data, dict):
        return [v for k, item in data.items() for v in literal_secrets(item, path + (k,))]
    if isinstance(data, list):
        return [v for i, item in enumerate(data) for v in literal_secrets(item, path + (i,))]
    return [data] if isinstance(data, str) and any(looks_secret(p) for p in path) else []


# Shorter values are not scrubbed: replacing every "1" or "ab" in a log would destroy it,
# and a value that short protects nothing. Values that are also common words ("cuda",
# "runs") ARE scrubbed, wherever they appear: over-redacting a log line is the safe side.
MIN_SECRET_CHARS = 3


def secret_forms(values: Iterable[str]) -> list[str]:
    """Every text a value is likely to appear as: itself, escaped inside JSON (job.json,
    metrics, events), inside a Python repr (error messages), percent-encoded (URLs, keys)
    and inside a single-quoted YAML string. Longest first (so a value containing another is
    replaced whole), without repeats, each at least :data:`MIN_SECRET_CHARS` long."""
    forms: set[str] = set()
    for value in values:
        if not isinstance(value, str) or len(value) < MIN_SECRET_CHARS:
            continue
        forms.update((value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
                      repr(value)[1:-1], quote(value, safe=""), quote(value),
                      value.replace("'", "''")))
    return sorted((f for f in forms if len(f) >= MIN_SECRET_CHARS), key=lambda f: (-len(f), f))


def scrubber(values: Iterable[str]) -> Callable[[str], str]:
    """A function that replaces every :func:`secret_forms` of ``values`` in a text with
    ``***``, longest form first over the whole text: a longer secret overlapping a shorter
    one is hidden whole. (Not one regex of the forms: re compiles a megabyte-long value in
    seconds, and its one pass lets a shorter form claim the start of a longer one.)"""
    forms = secret_forms(values)

    def scrub_text(text: str) -> str:
        for form in forms:
            text = text.replace(form, REDACTED)  # the text itself when the form is absent
        return text

    return scrub_text


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Last line of defence: no resolved value (of :data:`MIN_SECRET_CHARS`+ characters),
    nor its JSON / repr / URL form, survives in a message, even inside a longer string."""
    return scrubber(secrets)(text)
