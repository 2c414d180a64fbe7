"""Checkpoints in a store, committed the same way as on local disk (ten.train.checkpoint).

Layout under ``<job>/``: ``checkpoints/step-NNNNNNNN/<files>`` with the local
``manifest.json`` (each file's size and sha256) and ``LATEST`` (``step-NNNNNNNN``).

Commit protocol (upload): every file is uploaded and verified (size, and ETag or a
re-read sha256: see :mod:`runner.storage.s3`), the lease is checked, then the manifest is
written LAST, then ``LATEST`` moves forward. A step folder without a manifest was never
committed; a reader skips it. Re-uploading a step first removes its old manifest, so a
half-done overwrite is never trusted either.

Reading: :func:`latest_committed` trusts only steps whose manifest exists and whose
objects all exist with the manifest's sizes (``LATEST`` is a hint that is checked, not
believed). :func:`download_checkpoint` verifies every sha256 and commits locally like
``ten.train.checkpoint.save``; :func:`restore_latest` falls back to older steps when one is
corrupt, and never quietly returns "nothing" over a bucket that has committed
checkpoints it cannot read.

A manifest is untrusted input (whoever can write the bucket): any malformed one (bad
JSON, missing keys, wrong types, unsafe file names, another step's) makes its step
corrupt, skipped with one line like a failed checksum; the checks are ten.train.checkpoint's
own (:func:`ten.train.checkpoint.manifest_problem`), which, like this module, does not import
torch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runner.storage.base import StorageError, Store, sha256_file
from runner.storage.lease import Lease, LeaseLost
from runner.storage.retention import retained_steps
from ten.fileio import fsync_dir
from ten.train import checkpoint as tc

__all__ = ["CorruptCheckpoint", "Lease", "LeaseLost", "NoWholeCheckpoint", "committed_steps",
           "download_checkpoint", "latest_committed", "prune_remote", "restore_latest",
           "retained_steps", "upload_checkpoint"]

MANIFEST = tc.MANIFEST  # the local format is the bucket's: ten.train.checkpoint defines it
LATEST = "LATEST"
step_name, step_of = tc.step_name, tc.step_of
Report = Callable[[str], None]


class CorruptCheckpoint(StorageError):
    """A remote checkpoint is incomplete or fails its checksums (an older one may do)."""


def _step_prefix(job_prefix: str, step: int) -> str:
    return f"{job_prefix.strip('/')}/checkpoints/{step_name(step)}"


def parse_manifest(raw: bytes, where: str, step: int | None = None) -> dict[str, Any]:
    """A manifest's dict, checked enough to trust its file names and numbers (and, with
    ``step``, that it is that step's); CorruptCheckpoint (one line) otherwise."""
    try:
        return tc.parse_manifest(raw, where, step)
    except tc.CheckpointError as e:
        raise CorruptCheckpoint(str(e)) from None


def _missing_objects(store: Store, prefix: str, manifest: dict[str, Any]) -> str | None:
    """Why the step's objects do not match the manifest's sizes, or None when they do."""
    for name, entry in manifest["files"].items():
        info = store.head(f"{prefix}/{name}")
        if info is None:
            return f"{name} is missing"
        if info.size != entry["size"]:
            return f"{name} has {info.size} bytes, manifest says {entry['size']}"
    return None


def committed_steps(store: Store, job_prefix: str) -> list[int]:
    """Steps whose manifest exists in the store, oldest first (not yet verified)."""
    steps = set()
    base = f"{job_prefix.strip('/')}/checkpoints/"
    for key in store.list(base):
        parts = key[len(base):].split("/")
        step = step_of(parts[0])
        if step is not None and parts[1:] == [MANIFEST]:
            steps.add(step)
    hint = _latest_hint(store, job_prefix)
    if hint is not None and hint not in steps and store.head(
            f"{_step_prefix(job_prefix, hint)}/{MANIFEST}") is not None:
        steps.add(hint)  # a listing that lags behind LATEST
    return sorted(steps)


def _latest_hint(store: Store, job_prefix: str) -> int | None:
    raw = store.get_bytes(f"{job_prefix.strip('/')}/{LATEST}")
    return step_of(raw.decode(errors="replace").strip()) if raw else None


def upload_checkpoint(store: Store, job_prefix: str, local_ckpt_dir: Path,
                      lease: Lease | None = None, workers: int = 4) -> str:
    """Upload a committed local checkpoint; returns the remote step prefix.

    Files first (in parallel, each verified), then ``manifest.json``, then ``LATEST``.
    With ``lease``, a newer writer makes this raise :class:`LeaseLost` before anything
    is committed. Idempotent: re-uploading an identical, intact step only re-points
    ``LATEST``.
    """
    local = Path(local_ckpt_dir)
    try:
        raw = (local / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{local} has no {MANIFEST}: not a committed checkpoint, "
                           "not uploading it") from None
    except OSError as e:
        raise StorageError(f"cannot read {local / MANIFEST}: {e.strerror or e}") from None
    manifest = parse_manifest(raw, str(local), step_of(local.name))
    step = manifest["step"]
    prefix = _step_prefix(job_prefix, step)
    remote = store.get_bytes(f"{prefix}/{MANIFEST}")
    if remote != raw or _missing_objects(store, prefix, manifest) is not None:
        if remote is not None:  # un-commit before overwriting anything of this step
            store.delete([f"{prefix}/{MANIFEST}"])

        def put(item: tuple[str, dict[str, Any]]) -> None:
            name, entry = item
            path = local / name
            if not path.is_file() or path.stat().st_size != entry["size"]:
                raise StorageError(f"{local}: {name} is missing or has the wrong size; "
                                   "the local checkpoint is damaged, not uploading it")
            store.put_file(f"{prefix}/{name}", path, sha256=entry["sha256"])

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(put, sorted(manifest["files"].items())))
        if lease is not None:
            lease.check()
        store.put_bytes(f"{prefix}/{MANIFEST}", raw)
    if lease is not None:
        lease.check()
    current = _latest_hint(store, job_prefix)
    # LATEST only moves forward, except off a step that was never committed (garbage, or
    # an upload that died before its manifest): left there, it would name it forever.
    if current is None or current <= step or store.head(
            f"{_step_prefix(job_prefix, current)}/{MANIFEST}") is None:
        store.put_bytes(f"{job_prefix.strip('/')}/{LATEST}", step_name(step).encode())
    return prefix


def latest_committed(store: Store, job_prefix: str, report: Report = print) -> int | None:
    """The newest step whose manifest exists and whose objects all exist with the
    manifest's sizes; incomplete steps are reported and skipped. Content is verified on
    download (:func:`download_checkpoint`)."""
    hint = _latest_hint(store, job_prefix)
    steps = committed_steps(store, job_prefix)
    if hint is not None and hint not in steps:
        report(f"{store.url}/{job_prefix}/{LATEST} names {step_name(hint)}, which has no "
               "manifest; ignoring it")
    for step in reversed(steps):
        if _check_remote(store, job_prefix, step, report) is not None:
            return step
    return None


def _check_remote(store: Store, job_prefix: str, step: int,
                  report: Report) -> dict[str, Any] | None:
    prefix = _step_prefix(job_prefix, step)
    where = f"{store.url}/{prefix}"
    raw = store.get_bytes(f"{prefix}/{MANIFEST}")
    try:
        if raw is None:
            raise CorruptCheckpoint(f"{where}: {MANIFEST} disappeared")
        manifest = parse_manifest(raw, where, step)
        problem = _missing_objects(store, prefix, manifest)
        if problem:
            raise CorruptCheckpoint(f"{where}: {problem}")
    except CorruptCheckpoint as e:
        report(f"skipping incomplete remote checkpoint: {e}")
        return None
    return manifest


def download_checkpoint(store: Store, job_prefix: str, step: int, local_ckpt_root: Path,
                        workers: int = 4) -> Path:
    """Download ``step`` into ``local_ckpt_root/step-NNNNNNNN``, verify every sha256, and
    commit it like ten.train.checkpoint.save (temporary folder, manifest last, rename).

    Raises :class:`CorruptCheckpoint` (a StorageError) when an object is missing or fails
    its checksum, StorageError when the store cannot be read."""
    prefix = _step_prefix(job_prefix, step)
    where = f"{store.url}/{prefix}"
    raw = store.get_bytes(f"{prefix}/{MANIFEST}")
    if raw is None:
        raise CorruptCheckpoint(f"{where} is not committed (no {MANIFEST})")
    manifest = parse_manifest(raw, where, step)
    root = Path(local_ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    if _local_matches(final, raw, manifest):
        return final
    tmp = tc.temp_dir(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        def get(item: tuple[str, dict[str, Any]]) -> None:
            name, entry = item
            try:
                store.get_file(f"{prefix}/{name}", tmp / name)
            except StorageError as e:
                if store.head(f"{prefix}/{name}") is None:
                    raise CorruptCheckpoint(f"{where}: {name} is missing") from None
                raise e from None
            size = (tmp / name).stat().st_size
            if size != entry["size"]:
                raise CorruptCheckpoint(f"{where}/{name} has {size} bytes, manifest says "
                                        f"{entry['size']}")
            if sha256_file(tmp / name) != entry["sha256"]:
                raise CorruptCheckpoint(f"{where}/{name} fails its sha256 check (corrupt)")

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(get, sorted(manifest["files"].items())))
        with open(tmp / MANIFEST, "wb") as f:  # the manifest last, as ten.train.checkpoint.save
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        # A local copy of this step (damaged, or another version) stays in place until
        # the verified download replaces it: moved aside, never deleted first.
        tc.install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _local_matches(path: Path, raw: bytes, manifest: dict[str, Any]) -> bool:
    """Is ``path`` already this exact checkpoint, intact? (A restart before training.)"""
    try:
        if (path / MANIFEST).read_bytes() != raw:
            return False
        return all((path / n).stat().st_size == e["size"] and sha256_file(path / n) == e[
            "sha256"] for n, e in manifest["files"].items())
    except OSError:
        return False


def restore_latest(store: Store, job_prefix: str, local_ckpt_root: Path,
                   report: Report = print,
                   usable: Callable[[Path], str | None] | None = None) -> int | None:
    """Download the newest committed step that downloads and verifies; returns its step,
    or None when the store holds no committed checkpoint for this job.

    A corrupt or incomplete step is reported and the next older one tried; so is one
    that ``usable(local_path)`` finds a problem with (e.g. a file that is not plain
    tensors: its sha256 proves nothing to whoever could write the bucket), and its local
    copy is removed. If committed steps exist but none verifies, or the store cannot be
    read, this raises StorageError (:class:`NoWholeCheckpoint` for the first): a run
    never silently restarts from scratch over an existing one."""
    steps = committed_steps(store, job_prefix)
    for step in reversed(steps):
        if _check_remote(store, job_prefix, step, report) is None:
            continue
        try:
            path = download_checkpoint(store, job_prefix, step, local_ckpt_root)
        except CorruptCheckpoint as e:
            report(f"skipping corrupt remote checkpoint: {e}")
            continue
        problem = usable(path) if usable is not None else None
        if problem is not None:
            report(f"skipping unusable remote checkpoint: {problem}")
            shutil.rmtree(path, ignore_errors=True)
            continue
        return step
    if steps:
        raise NoWholeCheckpoint(f"{store.url}/{job_prefix}/checkpoints has {len(steps)} "
                                "committed checkpoint(s) but none downloads and verifies")
    return None


class NoWholeCheckpoint(StorageError):
    """Committed steps exist and none restores. What to do differs: a run resuming must
    not start from scratch over them; a reader may have met a run pruning them."""


def prune_remote(store: Store, job_prefix: str, keep_last: int,
                 milestone_every: int | None = None, report: Report = print,
                 lease: Lease | None = None) -> list[int]:
    """Delete committed steps outside :func:`retained_steps` (manifest first, so a crash
    mid-delete leaves an uncommitted folder, never a committed broken one), and leftover
    uncommitted step folders older than the newest committed step. Returns the deleted
    committed steps. With ``lease``, a superseded writer raises LeaseLost and deletes
    nothing."""
    base = f"{job_prefix.strip('/')}/checkpoints/"
    by_step: dict[int, list[str]] = {}
    for key in store.list(base):
        step = step_of(key[len(base):].split("/")[0])
        if step is not None:
            by_step.setdefault(step, []).append(key)
    committed = sorted(s for s, keys in by_step.items()
                       if f"{base}{step_name(s)}/{MANIFEST}" in keys)
    if not committed:
        return []
    keep = set(retained_steps(committed, keep_last, milestone_every))
    doomed = [s for s in committed if s not in keep]
    if lease is not None:
        lease.check()
    for step in doomed:
        manifest_key = f"{base}{step_name(step)}/{MANIFEST}"
        store.delete([manifest_key])
        store.delete([k for k in by_step[step] if k != manifest_key])
    for step, keys in sorted(by_step.items()):
        if step not in committed and step < committed[-1]:
            report(f"removing uncommitted remote checkpoint {step_name(step)}")
            store.delete(keys)
    return doomed
