"""``builtin:botocore-docs``: an English corpus that needs no download.

botocore (installed with boto3, a dependency of the runner) ships a JSON description of
every AWS service, and every operation, shape and member in it carries a
``documentation`` string of HTML prose. Stripped of tags and deduplicated, that is a
few tens of MB of technical English: enough for a smoke-test job to learn something
real with no network at all.

The files are read by path: ``ten`` never imports boto3 or botocore (an import-rule
test enforces it), so the package is only *located* with ``importlib.util.find_spec``.

Determinism: services are sorted by name, only the newest API version of each is
read, the JSON is walked with sorted keys, and a string seen earlier in that order is
dropped. One service is one document, keyed by its name; the held-out split is a fixed
set chosen by a hash of that name (see :data:`VAL_FRACTION`), so it never changes with
the job's ``val_fraction``. The extracted text is cached as JSONL keyed by the botocore
version and :data:`EXTRACTOR_VERSION`.
"""

from __future__ import annotations

import gzip
import html
import importlib.util
import json
import multiprocessing as mp
import os
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ten.data.errors import DataError, disk_errors

NAME = "builtin:botocore-docs"
EXTRACTOR_VERSION = 1
# Fraction of services held out for validation (fixed; chosen by hash of the name).
VAL_FRACTION = 0.03
# Doc strings shorter than this (after stripping) are boilerplate ("The ID."): dropped.
MIN_CHARS = 40

_TAG = re.compile(r"<[^>]*>")
_BLOCK_END = re.compile(r"</(p|li|ul|ol|note|important|dd|dt|h\d)>|<br\s*/?>", re.I)
_SPACE = re.compile(r"[ \t\r\f\v\u00a0]+")


def botocore_data_dir() -> tuple[Path, str]:
    """(botocore's data directory, botocore version), found without importing botocore."""
    spec = importlib.util.find_spec("botocore")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"{NAME} needs the botocore package (pip install boto3); "
                        "or choose another DataConfig.dataset")
    pkg = Path(list(spec.submodule_search_locations)[0])
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", (pkg / "__init__.py").read_text())
    return pkg / "data", match.group(1) if match else "unknown"


def clean_html(doc: str) -> str:
    """HTML doc string -> plain text: block ends become newlines, tags and entities go."""
    text = _TAG.sub(" ", _BLOCK_END.sub("\n", doc))
    if "&" in text:
        text = html.unescape(text)
    lines = (line.strip() for line in _SPACE.sub(" ", text).split("\n"))
    return "\n".join(line for line in lines if line)


def _doc_strings(node: object) -> Iterator[str]:
    """Every ``documentation`` string in a service description, in sorted-key order.

    A depth-first walk with an explicit stack (children pushed in reverse), which visits
    the same order as the obvious recursion at a fraction of its generator overhead.
    """
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, str):  # only documentation strings are ever pushed
            yield node
        elif isinstance(node, dict):
            for key in sorted(node, reverse=True):
                value = node[key]
                if (key == "documentation" and isinstance(value, str)) or \
                        isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(v for v in reversed(node) if isinstance(v, dict | list))


def _service_files(data_dir: Path) -> list[tuple[str, Path]]:
    """(service name, newest service-2.json[.gz]) for every service, sorted by name."""
    out = []
    for service in sorted(os.listdir(data_dir)):
        sdir = data_dir / service
        if not sdir.is_dir():
            continue
        versions = sorted(v for v in os.listdir(sdir) if (sdir / v).is_dir())
        for version in reversed(versions):
            found = [sdir / version / n for n in ("service-2.json.gz", "service-2.json")
                     if (sdir / version / n).exists()]
            if found:
                out.append((service, found[0]))
                break
    return out


def _paragraphs(path: Path) -> list[str]:
    """One service's cleaned doc strings of at least MIN_CHARS, in order (duplicates kept)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        spec = json.load(f)
    return [text for text in map(clean_html, _doc_strings(spec)) if len(text) >= MIN_CHARS]


def extract(data_dir: Path, processes: int | None = None) -> Iterator[dict[str, str]]:
    """Yield {"key": service, "text": prose} documents, deterministically.

    Services are parsed and cleaned in parallel (results come back in order); the
    cross-service deduplication runs here, in sorted order, so the output does not
    depend on the number of processes.
    """
    files = _service_files(data_dir)
    paths = [path for _, path in files]
    processes = processes or os.cpu_count() or 1
    if processes > 1 and not mp.current_process().daemon:  # loader workers cannot fork
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
            results = list(pool.map(_paragraphs, paths, chunksize=8))
    else:
        results = [_paragraphs(path) for path in paths]
    seen: set[str] = set()
    for (service, _), paragraphs in zip(files, results, strict=True):
        kept = []
        for text in paragraphs:
            if text not in seen:
                seen.add(text)
                kept.append(text)
        if kept:
            yield {"key": service, "text": "\n\n".join(kept)}


def corpus_path(cache_dir: Path) -> Path:
    """The cached JSONL for this botocore version, extracted on first use (atomic write)."""
    data_dir, version = botocore_data_dir()
    path = cache_dir / "builtin" / f"botocore-docs-{version}-v{EXTRACTOR_VERSION}.jsonl"
    if path.exists():
        return path
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    # A full disk is one line naming the file, and leaves no partial temp file behind.
    with disk_errors(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                for doc in extract(data_dir):
                    f.write(json.dumps(doc) + "\n")  # ASCII-escaped: no U+2028 surprises
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def version() -> str:
    return f"botocore-{botocore_data_dir()[1]}-v{EXTRACTOR_VERSION}"
