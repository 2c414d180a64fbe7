"""Atomic checkpoints on local disk: ``<run>/checkpoints/step-NNNNNNNN/``.

A checkpoint is written into a hidden temporary folder, every file fsynced, then a
``manifest.json`` listing each file's size and sha256 is written *last*, and only then
is the folder renamed to its final name (an atomic rename on POSIX). So:

* a folder named ``step-*`` without a verifying manifest was never committed (or has
  been damaged since): readers skip it and report it;
* a crash at any moment leaves either the previous checkpoint set or the new one,
  never a half-written checkpoint that looks complete. Re-saving a step that exists
  moves the committed folder aside and deletes it only once the new one is in place;
  :func:`cleanup` puts a complete folder back if a crash came in between.

A manifest is untrusted input (a damaged disk, a bucket others can write): anything
malformed makes its checkpoint corrupt, never a crash. Checkpoint files hold tensors and
plain containers only and are loaded with ``weights_only=True``: a file that holds
anything else is refused, never unpickled.

Retention keeps the newest ``keep_last`` committed checkpoints.

The format and commit helpers need only the standard library (torch is imported where a
file is serialised or loaded), so the torch-free bucket code shares them
(runner.storage.checkpoints).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ten.fileio import ENVIRONMENT_ERRNOS, describe_os_error, fsync_dir, sha256_file

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8})$")
# Leftovers of an interrupted save or download: ``.tmp-step-N-PID`` (the new folder) and
# ``.old-step-N-PID`` (the committed one, moved aside while its replacement goes in).
_LEFTOVER_RE = re.compile(r"^\.(tmp|old)-(step-\d{8})-\d+$")
# Names a manifest may list: plain file names, so none can point outside its folder.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or corrupt (one line, names the folder)."""


class CheckpointWriteError(Exception):
    """A checkpoint could not be written because of the machine (a full or read-only
    disk, a permission): one line with the path and the free space. The temporary folder
    is removed and earlier checkpoints are untouched."""


def step_name(step: int) -> str:
    """A checkpoint folder's name: ``step-NNNNNNNN``."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name holds (:func:`step_name`), or None."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def temp_dir(root: Path, step: int) -> Path:
    """Where this process writes ``step`` before its rename into place; :func:`cleanup`
    knows these and removes what a crash left."""
    return root / f".tmp-{step_name(step)}-{os.getpid()}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def manifest_problem(manifest: Any, step: int | None = None) -> str | None:
    """Why a decoded manifest cannot be trusted (a phrase such as ``has no "files"
    object``), or None. Checked before any of its names or numbers is used; with
    ``step``, the manifest must be for that step (the folder it sits in)."""
    if not isinstance(manifest, dict):
        return f"is a JSON {type(manifest).__name__}, not an object"
    if not _is_int(manifest.get("format")) or manifest["format"] != FORMAT_VERSION:
        return f"has format {manifest.get('format')!r}, expected {FORMAT_VERSION}"
    if not _is_int(manifest.get("step")) or manifest["step"] < 0:
        return f"has no valid step ({manifest.get('step')!r})"
    if step is not None and manifest["step"] != step:
        return f"is for step {manifest['step']}, not {step}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return 'has no "files" object'
    for name, entry in files.items():
        if not _NAME_RE.match(name) or name == MANIFEST:
            return f"lists a bad file name {name!r}"
        if not (isinstance(entry, dict) and _is_int(entry.get("size")) and entry["size"] >= 0
                and isinstance(entry.get("sha256"), str) and _SHA256_RE.match(entry["sha256"])):
            return f"has a malformed entry for {name} (needs size and sha256)"
    return None


def parse_manifest(raw: bytes, where: str, step: int | None = None) -> dict[str, Any]:
    """A manifest's dict from its bytes, or CheckpointError naming ``where`` and why."""
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{where}/{MANIFEST} is not valid JSON") from None
    problem = manifest_problem(manifest, step)
    if problem:
        raise CheckpointError(f"{where}/{MANIFEST} {problem}")
    return manifest


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _torch_bytes(obj: Any) -> bytes:
    import torch  # here, not at the top: the format and commit helpers are torch-free

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save(root: Path, step: int, files: dict[str, Any], meta: dict[str, Any] | None = None) -> Path:
    """Commit a checkpoint of ``files`` (name -> torch-saveable object, or bytes) at ``step``.

    ``root`` is the ``checkpoints`` folder. Returns the committed folder. A full or
    read-only disk raises :class:`CheckpointWriteError` and leaves no temporary folder.
    """
    for name in files:
        if not _NAME_RE.match(name) or name == MANIFEST:
            raise ValueError(f"bad checkpoint file name {name!r}")
    final = root / step_name(step)
    tmp = temp_dir(root, step)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
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
        install(tmp, final)
    except OSError as e:
        _remove(tmp)  # best effort: without its rename a temporary folder is never trusted
        if e.errno in ENVIRONMENT_ERRNOS:
            raise CheckpointWriteError(describe_os_error(e, final, "write checkpoint")) from None
        raise
    return final


def install(tmp: Path, final: Path) -> None:
    """Rename the complete folder ``tmp`` (manifest written and fsynced) to ``final``.

    If ``final`` exists (a re-save of the same step, or a re-download) it is renamed
    aside first and deleted only after ``tmp`` is in place: a crash in between leaves
    both complete folders under hidden names, and :func:`cleanup` renames one back."""
    aside = None
    if final.exists():
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        _remove(aside)
        os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except OSError:
        if aside is not None:
            os.replace(aside, final)
        raise
    fsync_dir(final.parent)
    if aside is not None:
        _remove(aside)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def read_manifest(path: Path, step: int | None = None) -> dict[str, Any]:
    try:
        raw = (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MANIFEST} (never committed)") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable {MANIFEST} ({e.strerror or e})") from None
    return parse_manifest(raw, str(path), step)


def verify(path: Path, step: int | None = None) -> dict[str, Any]:
    """Check every file against the manifest (size, then sha256); return the manifest.

    ``step`` defaults to the one in the folder's name (``step-NNNNNNNN``)."""
    if step is None:
        step = step_of(path.name)
    manifest = read_manifest(path, step)
    for name, entry in manifest["files"].items():
        f = path / name
        try:
            size = f.stat().st_size if f.is_file() else None
            if size is None:
                raise CheckpointError(f"{path}: {name} is missing")
            if size != entry["size"]:
                raise CheckpointError(f"{path}: {name} has {size} bytes, "
                                      f"manifest says {entry['size']}")
            if sha256_file(f) != entry["sha256"]:
                raise CheckpointError(f"{path}: {name} fails its sha256 check (corrupt)")
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read {name} ({e.strerror or e})") from None
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
        step = step_of(p.name)
        if step is not None and (p / MANIFEST).is_file():
            steps.append(step)
    return sorted(steps)


def valid_checkpoints(root: Path, report: Callable[[str], None] = print) -> Iterator[Found]:
    """Checkpoints whose manifest verifies, newest first; corrupt ones are reported (one
    line each) and skipped. Lazy: each is verified only when the caller gets to it."""
    for step in reversed(committed_steps(root)):
        path = root / step_name(step)
        try:
            found = Found(path, step, verify(path, step))
        except CheckpointError as e:
            report(f"skipping corrupt checkpoint: {e}")
            continue
        yield found


def latest_valid(root: Path, report: Callable[[str], None] = print) -> Found | None:
    """The newest checkpoint whose manifest verifies; corrupt newer ones are reported."""
    return next(valid_checkpoints(root, report), None)


def find(root: Path, step: int | None = None,
         report: Callable[[str], None] = print) -> Found:
    """The newest checkpoint under ``root`` whose manifest verifies, or ``step``'s;
    CheckpointError (one line, naming the committed steps) when there is none."""
    found = next((f for f in valid_checkpoints(root, report)
                  if step is None or f.step == step), None)
    if found is None:
        steps = ", ".join(map(str, committed_steps(root))) or "none"
        which = "committed checkpoint" if step is None else f"valid checkpoint of step {step}"
        raise CheckpointError(f"no {which} under {root} (committed steps: {steps})")
    return found


def cleanup(root: Path, report: Callable[[str], None] = print) -> None:
    """Finish or undo whatever a crash interrupted, before anything reads ``root``.

    * A step folder without a manifest was never committed (or half pruned): removed.
    * A ``.tmp-``/``.old-`` folder holding a complete, verifying checkpoint whose step
      folder is missing is the only copy of that step (a crash between the renames of
      :func:`install`): renamed back into place, the new (``.tmp``) one first.
    * Any other ``.tmp-``/``.old-`` leftover is removed.
    """
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if _STEP_RE.match(p.name) and not (p / MANIFEST).exists():
            report(f"removing uncommitted checkpoint folder {p.name}")
            _remove(p)
    leftovers = [(m.group(1), m.group(2), p) for p in root.iterdir()
                 if (m := _LEFTOVER_RE.match(p.name))]
    for _kind, name, p in sorted(leftovers, key=lambda x: x[0] != "tmp"):
        final = root / name
        if not final.exists() and p.is_dir() and not p.is_symlink():
            try:
                verify(p, int(name[len("step-"):]))
            except CheckpointError:
                pass
            else:
                report(f"restoring checkpoint {name} from {p.name} (a save was interrupted "
                       "between its renames)")
                os.replace(p, final)
                fsync_dir(root)
                continue
        report(f"removing uncommitted checkpoint folder {p.name}")
        _remove(p)
    # ``.tmp-`` files of other writers (atomic_copy) that a crash left behind
    for p in root.iterdir():
        if p.name.startswith(".tmp-") and p.exists():
            report(f"removing uncommitted checkpoint folder {p.name}")
            _remove(p)


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
    """Load one torch-saved file of a (verified) checkpoint: tensors and plain containers
    only (``weights_only=True``). Anything else is refused without being unpickled: a
    sha256 in the manifest beside it proves nothing to someone who can write both."""
    import torch

    try:
        return torch.load(path / name, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: {name} refuses to load: not plain tensors (possibly "
                              f"tampered){_refusal_reason(e)}; restore it from a trusted copy"
                              ) from None
    except Exception as e:  # noqa: BLE001 - any other failure to read is a corrupt file
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"{path}: cannot load {name} ({type(e).__name__}: {first})"
                              ) from None


def _refusal_reason(e: Exception) -> str:
    """torch's reason in a few words (e.g. ``unsupported GLOBAL posix.system``), from its
    multi-paragraph message; empty when there is none to pick."""
    for line in str(e).splitlines():
        line = line.strip()
        if "GLOBAL" in line or line.startswith("Unsupported"):
            return f": {line.rstrip('.')}"
    return ""


def load_problem(path: Path) -> str | None:
    """Why a verified checkpoint's torch files cannot be loaded (see :func:`load`), or
    None. Used where a step must be known usable before older copies are given up, e.g.
    a step restored from a bucket that anyone with write access could have replaced."""
    for name in read_manifest(path)["files"]:
        if name.endswith(".pt"):
            try:
                load(path, name)
            except CheckpointError as e:
                return str(e)
    return None
