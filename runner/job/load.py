"""``load_job``: file -> YAML with lines -> ``--set`` -> ``${VAR}`` -> schema -> checks.

Every step collects problems instead of stopping at the first, so one run of
``ten-runner validate`` shows everything to fix. Nothing here imports torch at module
level; the model and dataset checks import it when they run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError

from runner.job import checks, peek
from runner.job.errors import (
    Problems,
    describe,
    describe_hidden,
    section_fields,
    shorten,
    show,
    unknown_key,
)
from runner.job.schema import JobSchema
from runner.job.secrets import literal_secrets, redact, scrubber, sensitive, substitute
from runner.job.yamlfile import MAX_BYTES, YamlProblem, parse, parse_scalar

Path_ = tuple[str | int, ...]
EXAMPLE = "jobs/tiny-cpu.yaml"
# A model's shape in the line that says which model a job trains (Job.model_text).
SHAPE_FIELDS = ("n_layers", "d_model", "n_heads", "n_eigenstates", "seq_len", "vocab_size")
# Keys of which a job gives at most one: a --set of one replaces the other when the file
# gave it (the command line wins), instead of reporting "not both".
EXCLUSIVE: tuple[tuple[Path_, Path_], ...] = (
    (("train", "max_steps"), ("train", "max_tokens")),
    (("data", "tokenizer", "path"), ("data", "tokenizer", "vocab_size")),
)


class Job(JobSchema):
    """A validated job. Build it with :func:`load_job`."""

    _source_path: Path | None = PrivateAttr(None)
    _written: dict[Path_, str] = PrivateAttr(default_factory=dict)
    _secrets: tuple[str, ...] = PrivateAttr(())
    _scrubber: Any = PrivateAttr(None)
    _models: dict[int | None, Any] = PrivateAttr(default_factory=dict)  # model_settings'

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    def secret_values(self) -> list[str]:
        """Every value that must never be written out: what each ``${VAR}`` of the job
        resolved to (whatever field it is in, and even when it is only part of one, as
        in ``/data/x-${TOKEN}/``), and any string under a secret-looking key. Includes
        values shorter than ``secrets.MIN_SECRET_CHARS``, which :meth:`scrub` leaves."""
        return list(self._secrets)

    def scrub(self, text: str) -> str:
        """``text`` with every :meth:`secret_values` entry of 3+ characters, and its JSON,
        repr, percent-encoded and YAML-quoted forms, replaced by ``***`` (also inside
        longer words). Pass every log line, error message, metric/event record and bucket
        object written as text through it."""
        if self._scrubber is None:
            self._scrubber = scrubber(self._secrets)
        return self._scrubber(text)

    def redacted_dict(self) -> dict[str, Any]:
        """The resolved job as JSON-able data, safe to print, log and save: substituted
        fields read ``${VAR}`` again and secret-named fields read ``***``."""
        return redact(self.model_dump(mode="json"), self._written)

    def budget_text(self) -> str:
        t = self.train
        return f"{t.max_steps:,} steps" if t.max_steps is not None else f"{t.max_tokens:,} tokens"

    def summary(self) -> str:
        """One line for logs: name, arch/preset, budget (from the redacted values)."""
        r = self.redacted_dict()
        return f"name={r['name']}, {r['model']['arch']}/{r['model']['preset']}, " \
               f"{self.budget_text()}"

    def model_settings(self, vocab_size: int | None = None) -> Any:
        """The TENConfig / TransformerConfig this job trains (imports torch): the preset,
        the job's overrides, data.seq_len, and ``vocab_size`` (the tokenizer's, known once
        the data is prepared; the preset's when not given). Built once per vocabulary and
        kept (the job and the config are frozen): a transformer's build counts parameters
        on three meta models, and a run asks for its model in several places."""
        from ten.model.presets import model_config

        if vocab_size not in self._models:
            fixed = {"seq_len": self.data.seq_len}
            if vocab_size is not None:
                fixed["vocab_size"] = vocab_size
            self._models[vocab_size] = model_config(self.model.arch, self.model.preset,
                                                    **{**self.model.overrides, **fixed})
        return self._models[vocab_size]

    @property
    def vocabulary_from(self) -> str | None:
        """The setting whose tokenizer decides the model's vocabulary, once it is read
        (``data.tokenizer.path``, ``train.init_from``); None: data.tokenizer.vocab_size."""
        if self.train.init_from is not None:
            return "train.init_from"
        return "data.tokenizer.path" if self.data.tokenizer.path is not None else None

    def model_text(self) -> str:
        """The model this job trains, in a line: arch/preset, its shape, and each value
        the job set over the preset's (which setting won); scrubbed. Imports torch."""
        from ten.model.presets import model_config

        preset = dataclasses.asdict(model_config(self.model.arch, self.model.preset))
        chosen = dataclasses.asdict(self.model_settings(self.data.tokenizer.vocab_size))
        given = self.vocabulary_from
        if given is not None:  # not known before that tokenizer is read: never a guess
            chosen["vocab_size"] = preset["vocab_size"]
        shape = ", ".join(f"{k} {chosen[k]:,}" if k != "vocab_size" or given is None
                          else f"vocab_size from {given}'s tokenizer"
                          for k in SHAPE_FIELDS if k in chosen)
        origin = {"seq_len": "data.seq_len", "vocab_size": "data.tokenizer.vocab_size",
                  **{k: f"model.{k}" for k in self.model.overrides}}
        won = sorted(f"{origin.get(k, k)} {v} (preset {preset[k]})"
                     for k, v in chosen.items() if v != preset[k])
        return self.scrub(f"model {self.model.arch}/{self.model.preset}: {shape}"
                          + (f"; the job sets {', '.join(won)}" if won else ""))

    def __repr__(self) -> str:  # the default repr would show resolved secrets
        name = self.redacted_dict()["name"]
        return f"Job(name={name!r}, source_path={str(self._source_path)!r})"

    __str__ = __repr__


def load_job(path: str | os.PathLike[str], sets: Iterable[str] | None = None, *,
             env: Mapping[str, str] | None = None, check_model: bool = True,
             check_paths: bool = False, check_card: bool = False,
             fetch: Callable[[str], bytes | None] | None = None) -> Job:
    """Read, override, substitute and validate a job file. Raises :class:`JobError`
    listing every problem, one per line.

    ``check_paths``: also require a local ``data.dataset`` and ``data.tokenizer.path`` to
    exist here. Off by default: a job submitted to another machine or a container
    names paths that exist only there; ``validate`` and ``run`` (on the machine that
    trains) turn it on.

    ``check_card``: also estimate the job's memory on ``resources.accelerator`` when it
    trains on GPUs (seconds; ``validate``, ``submit`` and ``export``: before a card is
    rented; ``run`` checks the device it has instead).

    ``fetch(url)``: how an ``s3://`` job file is read — its bytes, None when there is no
    such object, ValueError (one line) when it cannot be read. The job layer does not
    open stores: the CLI passes ``runner.job.jobfile.fetch_job_file``."""
    source = str(path)
    problems = Problems(source)
    remote = source.lower().startswith("s3://")
    text = _fetch(source, fetch, problems) if remote else _read(Path(path), problems)
    if text is None:
        raise problems.error()
    job = parse_job(text, source=source, sets=sets, env=env, check_model=check_model,
                    check_paths=check_paths, check_card=check_card)
    job._source_path = None if remote else Path(path)
    return job


def parse_job(text: str, source: str = "<job>", sets: Iterable[str] | None = None, *,
              env: Mapping[str, str] | None = None, check_model: bool = True,
              check_paths: bool = False, check_card: bool = False) -> Job:
    """Like :func:`load_job`, from YAML text; ``source`` names it in errors."""
    if isinstance(sets, str):
        sets = [sets]
    problems = Problems(source)
    data = _document(text, source, problems)
    data = apply_sets(data, list(sets or ()), problems)
    data, written, used, env_problems = substitute(data, os.environ if env is None else env)
    problems.secrets = used + literal_secrets(data)
    for ep in env_problems:
        problems.add(ep.path, ep.message)
    unresolved = {ep.path for ep in env_problems}
    for path, message in checks.budget(data):
        problems.add(path, message)

    job = _validate(data, written, unresolved, problems)
    found = [] if job is None else checks.cross(job)
    if check_model:  # skipped where a ${VAR} is unresolved: it would only add noise
        found += _model_and_dataset(data, written, unresolved)
    if check_paths:
        found += [(path, message) for path, message in checks.local_paths(data.get("data"), written)
                  if path not in unresolved]
    if check_paths and job is not None and not found and not problems:
        found += peek.local_data(job)  # reads the data: only a job otherwise valid
    if check_card and check_model and job is not None and not found and not problems:
        found += checks.card_memory(job)
    for path, message in found:
        problems.add(path, message)
    if problems or job is None:
        raise problems.error()
    job._written = written
    job._secrets = tuple(dict.fromkeys(problems.secrets))
    return job


def with_sets(text: str, sets: Iterable[str], source: str = "<job>") -> str:
    """The job YAML ``text`` with ``--set`` overrides written into it: the file a job
    submitted with ``--set`` runs from, ``${VAR}`` references kept as written (they
    resolve where it runs). Without overrides, ``text`` itself (comments kept)."""
    import yaml

    sets = list(sets)
    if not sets:
        return text
    problems = Problems(source)
    data = apply_sets(_document(text, source, problems), sets, problems)
    if problems:
        raise problems.error()
    header = "".join(f"# --set {json.dumps(item)}\n" for item in sets)  # one line each
    return f"# {json.dumps(source)}, with\n{header}" + yaml.safe_dump(data, sort_keys=False,
                                                        allow_unicode=True)


def _document(text: str, source: str, problems: Problems) -> dict[str, Any]:
    """The YAML text as its top-level mapping, with each key's line kept in ``problems``;
    raises the error when it is not YAML, empty, or not a mapping."""
    try:
        data, problems.lines = parse(text)
    except YamlProblem as p:
        problems.add_line(p.line, f"{source}:{p.line}:{p.column} {p.message}" if p.line
                          else f"{source}: {p.message}")
        raise problems.error() from None
    if data is None:
        problems.add((), f"the file is empty (hint: a job needs name, model, data and train; "
                         f"see {EXAMPLE})")
    elif not isinstance(data, dict):
        problems.add((), f"expected a mapping of sections (name, model, data, train, ...) at "
                         f"the top level, got {describe_hidden(data, None)}")
    if problems:
        raise problems.error()
    return data


def _validate(data: dict[str, Any], written: dict[Path_, str], unresolved: set[Path_],
              problems: Problems) -> Job | None:
    """The schema's verdict: the Job, or None with each field error added to ``problems``
    (those under an unresolved ``${VAR}`` left out: that problem is already said)."""
    try:
        return Job.model_validate(data)
    except ValidationError as err:
        for e in err.errors():
            loc = tuple(e["loc"])
            if e["type"] == "missing" and loc and isinstance(loc[-1], int):
                loc = loc[:-1]  # a short list: name the list, which has a line
            if loc in unresolved:
                continue
            hidden = describe_hidden(e.get("input"), written.get(loc)) \
                if sensitive(loc, written) else None
            problems.add(loc, describe(e, JobSchema, hidden))
    return None


def _model_and_dataset(data: dict[str, Any], written: dict[Path_, str],
                       unresolved: set[Path_]) -> list[tuple[Path_, str]]:
    """The model (built on the meta device) and the dataset's name, each checked only when
    no ``${VAR}`` it depends on is unresolved."""
    data_section = data.get("data")
    seq_len = data_section.get("seq_len", 256) if isinstance(data_section, dict) else None
    found: list[tuple[Path_, str]] = []
    if not any(p[:1] == ("model",) or p == ("data", "seq_len") for p in unresolved):
        found += checks.model(data.get("model"), seq_len, written)
    if ("data", "dataset") not in unresolved:
        found += checks.dataset(data_section, written.get(("data", "dataset")))
    return found


def apply_sets(data: dict[str, Any], sets: list[str], problems: Problems) -> dict[str, Any]:
    """``a.b=value`` overrides, each value a YAML scalar; paths are checked against the
    schema (any key under ``model``: those are checked with the model). Setting one key
    of an :data:`EXCLUSIVE` pair to a value removes the other when the file gave it."""
    given_in_file = {key for pair in EXCLUSIVE for key in pair
                     if _lookup(data, key) is not None}
    for item in sets:
        parsed = _parse_set(item, problems)
        if parsed is not None and _assign(data, *parsed, problems):
            _drop_exclusive_twin(data, *parsed, given_in_file)
    return data


def _parse_set(item: str, problems: Problems) -> tuple[Path_, Any] | None:
    """``KEY=VALUE`` as (path, value), or None with the problem added."""
    key, sep, raw = item.partition("=")
    path: Path_ = tuple(p.strip() for p in key.strip().split("."))
    problems.overrides.add(path)
    if not sep or not all(path):
        problems.add(path, f"expected KEY=VALUE with a dotted key, got {show(item)} "
                           "(e.g. --set train.lr=1e-3)")
        return None
    where = _check_path(path)
    if where:
        problems.add(path, where)
        return None
    try:
        return path, parse_scalar(raw)
    except YamlProblem as p:
        problems.add(path, f"cannot parse the value: {p.message}")
        return None


def _assign(data: dict[str, Any], path: Path_, value: Any, problems: Problems) -> bool:
    """Set ``path`` to ``value``, making the sections on the way; False (with the problem
    added) where the file has a value where a section should be."""
    node = data
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            problems.add(path, f"{'.'.join(path[:depth + 1])} is not a mapping in the file")
            return False
        node = child
    node[path[-1]] = value
    return True


def _drop_exclusive_twin(data: dict[str, Any], path: Path_, value: Any,
                         given_in_file: set[Path_]) -> None:
    """E.g. a budget given on the command line replaces the file's, whichever kind;
    ``=null`` only clears, so the file's other key stays in force."""
    if value is None:
        return
    for pair in EXCLUSIVE:
        if path not in pair:
            continue
        other = pair[1] if path == pair[0] else pair[0]
        parent = _lookup(data, other[:-1])
        if other in given_in_file and isinstance(parent, dict):
            parent.pop(other[-1], None)


def _lookup(data: Any, path: Path_) -> Any:
    """The value at ``path`` in nested mappings, or None."""
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _check_path(path: Path_) -> str | None:
    if path[0] == "model" and len(path) == 2:
        return None  # arch, preset, or a model field (checked by checks.model)
    for depth in range(len(path)):
        known = section_fields(JobSchema, path[:depth])
        if known is None:
            return f"{'.'.join(path[:depth])} is a value, not a section"
        if path[depth] not in known:
            return unknown_key(JobSchema, path[:depth], path[depth])
    return None


def _read(path: Path, problems: Problems) -> str | None:
    def fail(message: str) -> None:
        problems.add_line(0, f"{shorten(str(path), 200)}: {message}")

    try:
        if path.is_dir():
            return fail(f"is a directory (hint: pass a job file such as {EXAMPLE})")
        if not path.exists():
            return fail("no such file")
        if not path.is_file():
            return fail("not a regular file")
        size = path.stat().st_size
        if size > MAX_BYTES:
            return fail(f"is {size:,} bytes; a job file must be under {MAX_BYTES:,}")
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        return fail(f"cannot read: {err.strerror or err}")
    return _decode(raw, fail)


def _fetch(url: str, fetch: Callable[[str], bytes | None] | None,
           problems: Problems) -> str | None:
    def fail(message: str) -> None:
        problems.add_line(0, f"{shorten(url, 200)}: {message}")

    if fetch is None:
        return fail("a job file in a bucket is read by ten-runner itself (run or validate "
                    "it with the CLI), not by load_job alone")
    try:
        raw = fetch(url)
    except ValueError as e:
        return fail(str(e))
    if raw is None:
        return fail("no such object")
    if len(raw) > MAX_BYTES:
        return fail(f"is {len(raw):,} bytes; a job file must be under {MAX_BYTES:,}")
    return _decode(raw, fail)


def _decode(raw: bytes, fail) -> str | None:
    if b"\0" in raw:
        return fail("not a text file (binary data)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return fail(f"not UTF-8 text (bad byte at offset {err.start})")
