"""The prepared-data cache: tokenized shards and the tokenizer, shared between runs.

Layout: ``datasets/<fingerprint>/parts-<writer>/<files>`` and
``datasets/<fingerprint>/COMMITTED``, a JSON marker written LAST, with a conditional put,
naming the writer's ``parts-`` folder and every file's size and sha256.

Each writer uploads into its own ``parts-<random>`` folder, so two jobs preparing the
same dataset at once never write the same object: the first marker wins (the loser
deletes its copy and gets False), and a reader only ever sees one writer's complete,
verified set. On a store without conditional writes the marker is read back; whichever
marker is the last one standing names a complete set all the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runner.storage.base import StorageError, Store, check_key, sha256_file

COMMITTED = "COMMITTED"
FORMAT_VERSION = 1
_FINGERPRINT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _base(fingerprint: str) -> str:
    if not _FINGERPRINT_RE.match(fingerprint or ""):
        raise ValueError(f"invalid dataset fingerprint {fingerprint!r}")
    return f"datasets/{fingerprint}"


def _local_files(local_dir: Path) -> list[str]:
    files = []
    for dirpath, _dirs, names in os.walk(local_dir):
        for name in names:
            if name.startswith("."):  # .tmp-* half-written, .lock: local coordination
                continue
            files.append((Path(dirpath) / name).relative_to(local_dir).as_posix())
    return sorted(files)


def is_committed(store: Store, fingerprint: str) -> bool:
    return store.head(f"{_base(fingerprint)}/{COMMITTED}") is not None


def upload_dataset(store: Store, fingerprint: str, local_dir: Path, workers: int = 4,
                   scrub: Callable[[str], str] | None = None) -> bool:
    """Upload every file under ``local_dir``, then the COMMITTED marker (last, if absent).
    ``scrub`` (the job's) rewrites the JSON files on the way (ten.data's manifest names
    the dataset as resolved, ``${VAR}`` values in it); the marker records what was
    uploaded, so a download verifies the scrubbed copy.

    Returns False, having written nothing that stays, when another writer committed
    this fingerprint first."""
    base, local_dir = _base(fingerprint), Path(local_dir)
    marker_key = f"{base}/{COMMITTED}"
    if is_committed(store, fingerprint):
        return False
    files = _local_files(local_dir)
    if not files:
        raise StorageError(f"{local_dir} holds no files: nothing to upload for dataset "
                           f"{fingerprint}")
    parts = f"parts-{uuid.uuid4().hex[:16]}"

    def put(rel: str) -> tuple[str, dict]:
        key, path = check_key(f"{base}/{parts}/{rel}"), local_dir / rel
        if scrub is not None and rel.endswith(".json"):
            data = scrub(path.read_text(encoding="utf-8")).encode()
            store.put_bytes(key, data)
            return rel, {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        sha = sha256_file(path)
        info = store.put_file(key, path, sha256=sha)
        return rel, {"size": info.size, "sha256": sha}

    with ThreadPoolExecutor(max(1, workers)) as pool:
        entries = dict(pool.map(put, files))
    marker = json.dumps({"format": FORMAT_VERSION, "fingerprint": fingerprint,
                         "parts": parts, "created": time.time(), "files": entries},
                        indent=1, sort_keys=True).encode()
    won = store.put_bytes(marker_key, marker, if_absent=True)
    if won and not store.conditional_writes:
        won = store.get_bytes(marker_key) == marker
    if not won:  # another writer committed first: our copy is garbage
        store.delete([f"{base}/{parts}/{rel}" for rel in files])
    return won


def _parse_marker(raw: bytes) -> dict | None:
    """The marker, if its names and numbers can be trusted as keys and paths."""
    try:
        marker = json.loads(raw)
        parts, entries = marker["parts"], marker["files"]
        ok = (marker["format"] == FORMAT_VERSION and isinstance(parts, str)
              and "/" not in check_key(parts) and isinstance(entries, dict) and entries)
        for rel, entry in entries.items():
            check_key(rel)
            ok = ok and isinstance(entry["size"], int) and isinstance(entry["sha256"], str)
    except (ValueError, KeyError, TypeError):
        return None
    return marker if ok else None


def download_dataset(store: Store, fingerprint: str, local_dir: Path,
                     report: Callable[[str], None] = print, workers: int = 4) -> bool:
    """Download a committed copy into ``local_dir`` (files verified by size and sha256
    before any is moved into place). False when there is no committed copy, or it is
    incomplete or corrupt (reported): prepare the data again. StorageError when the store
    cannot be read."""
    base, local_dir = _base(fingerprint), Path(local_dir)
    raw = store.get_bytes(f"{base}/{COMMITTED}")
    if raw is None:
        return False
    where = f"{store.url}/{base}"
    marker = _parse_marker(raw)
    if marker is None:
        report(f"ignoring cached dataset {where}: unreadable {COMMITTED} marker")
        return False
    parts, entries = marker["parts"], marker["files"]
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = local_dir.parent / f".tmp-{local_dir.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def get(item: tuple[str, dict]) -> str | None:
        rel, entry = item
        key = f"{base}/{parts}/{rel}"
        if store.head(key) is None:
            return f"{rel} is missing"
        store.get_file(key, tmp / rel)
        if (tmp / rel).stat().st_size != entry["size"] or sha256_file(tmp / rel) != entry[
                "sha256"]:
            return f"{rel} fails its size/sha256 check"
        return None

    try:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            problems = [p for p in pool.map(get, sorted(entries.items())) if p]
        if problems:
            report(f"ignoring cached dataset {where}: {problems[0]}")
            return False
        for rel in sorted(entries):
            (local_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, local_dir / rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True
