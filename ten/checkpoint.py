"""Atomic checkpoints on local disk: ``<run>/checkpoints/step-NNNNNNNN/``.

A checkpoint is written into a hidden temporary folder, every file fsynced, then a
``manifest.json`` listing each file's size and sha256 is written *last*, and only then
is the folder renamed to its final name (an atomic rename on POSIX). So:

* a folder named ``step-*`` without a verifying manifest was never committed (or has
  been damaged since): readers skip it and report it;
* a crash at any moment leaves either the previous checkpoint set or the new one,
  never a half-written checkpoint that looks complete.

Retention keeps the newest ``keep_last`` committed checkpoints.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ten.fileio import fsync_dir, sha256_file

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8})$")


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or corrupt (one line, names the folder)."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save(root: Path, step: int, files: dict[str, Any], meta: dict[str, Any] | None = None) -> Path:
    """Commit a checkpoint of ``files`` (name -> torch-saveable object, or bytes) at ``step``.

    ``root`` is the ``checkpoints`` folder. Returns the committed folder.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    tmp = root / f".tmp-{step_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    entries = {}
    for name, obj in files.items():
        data = obj if isinstance(obj, bytes) else _torch_bytes(obj)
        _write_bytes(tmp / name, data)
        entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": FORMAT_VERSION, "step": step, "created": time.time(),
                "files": entries, "meta": meta or {}}
    _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    fsync_dir(tmp)
    if final.exists():  # a re-run of the same step (e.g. after a crash mid-prune)
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    return final


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MANIFEST} (never committed)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {MANIFEST} ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: {MANIFEST} has an unknown format")
    return manifest


def verify(path: Path) -> dict[str, Any]:
    """Check every file against the manifest (size, then sha256); return the manifest."""
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if f.stat().st_size != entry["size"]:
            raise CheckpointError(f"{path}: {name} has {f.stat().st_size} bytes, "
                                  f"manifest says {entry['size']}")
        if sha256_file(f) != entry["sha256"]:
            raise CheckpointError(f"{path}: {name} fails its sha256 check (corrupt)")
    return manifest


@dataclass(frozen=True)
class Found:
    path: Path
    step: int
    manifest: dict[str, Any]


def committed_steps(root: Path) -> list[int]:
    """Steps of folders named step-NNNNNNNN that have a manifest, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / MANIFEST).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_valid(root: Path, report: Callable[[str], None] = print) -> Found | None:
    """The newest checkpoint whose manifest verifies; corrupt newer ones are reported."""
    for step in reversed(committed_steps(root)):
        path = root / step_name(step)
        try:
            return Found(path, step, verify(path))
        except CheckpointError as e:
            report(f"skipping corrupt checkpoint: {e}")
    return None


def cleanup(root: Path, report: Callable[[str], None] = print) -> None:
    """Remove temporary folders and step folders without a manifest (never committed)."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".tmp-") or (_STEP_RE.match(p.name) and not (p / MANIFEST).exists()):
            report(f"removing uncommitted checkpoint folder {p.name}")
            shutil.rmtree(p, ignore_errors=True)


def prune(root: Path, keep_last: int) -> list[int]:
    """Delete all but the newest ``keep_last`` committed checkpoints; returns deleted steps."""
    steps = committed_steps(root)
    doomed = steps[:-keep_last] if keep_last > 0 else steps
    for step in doomed:
        path = root / step_name(step)
        # Drop the manifest first: a crash mid-delete leaves an uncommitted folder.
        (path / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def load(path: Path, name: str, map_location: Any = "cpu") -> Any:
    """Load one torch-saved file of a (verified) checkpoint."""
    try:
        return torch.load(path / name, map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a corrupt file
        raise CheckpointError(f"{path}: cannot load {name} ({type(e).__name__}: {e})") from None
