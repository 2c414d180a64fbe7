"""Remote checkpoints: commit protocol, verification, fallback, retention, leases."""

from __future__ import annotations

import json
import os
import threading

import pytest

from runner.storage import StorageError
from runner.storage import checkpoints as rc
from runner.storage.checkpoints import (
    CorruptCheckpoint,
    Lease,
    LeaseLost,
    NoWholeCheckpoint,
    download_checkpoint,
    latest_committed,
    prune_remote,
    restore_latest,
    retained_steps,
    upload_checkpoint,
)
from ten.train import checkpoint as tc

JOB = "tiny-cpu"


def make_ckpt(root, step, size=3000):
    """A fake ten checkpoint: bytes instead of torch state (no training)."""
    return tc.save(root, step, {
        "model.pt": os.urandom(size), "optimizer.pt": os.urandom(size // 2),
        "trainer.pt": f"step {step}".encode(), "config.json": b'{"d_model": 32}'})


class Recorder:
    """Wraps a store and records the keys written, in order."""

    def __init__(self, store):
        self._store, self.writes = store, []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def put_file(self, key, path, sha256=None):
        self.writes.append(key)
        return self._store.put_file(key, path, sha256=sha256)

    def put_bytes(self, key, data, if_absent=False):
        self.writes.append(key)
        return self._store.put_bytes(key, data, if_absent=if_absent)


def flip_a_bit(store, key):
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(key, bytes(data))


def test_upload_commits_manifest_last_then_latest_and_restores(store, tmp_path):
    local = tmp_path / "local" / "checkpoints"
    make_ckpt(local, 1)
    path = make_ckpt(local, 2)
    rec = Recorder(store)
    remote = upload_checkpoint(rec, JOB, local / "step-00000001")
    assert remote == f"{JOB}/checkpoints/step-00000001"
    rec.writes.clear()
    upload_checkpoint(rec, JOB, path)
    prefix = f"{JOB}/checkpoints/step-00000002"
    assert rec.writes[-2:] == [f"{prefix}/manifest.json", f"{JOB}/LATEST"]
    assert sorted(rec.writes[:-2]) == [f"{prefix}/{n}" for n in
                                       ["config.json", "model.pt", "optimizer.pt", "trainer.pt"]]
    assert store.get_bytes(f"{JOB}/LATEST") == b"step-00000002"
    assert latest_committed(store, JOB) == 2

    restored = tmp_path / "restored" / "checkpoints"
    assert restore_latest(store, JOB, restored) == 2
    found = tc.latest_valid(restored)
    assert found.step == 2
    for name in ["model.pt", "optimizer.pt", "trainer.pt", "config.json", "manifest.json"]:
        assert (found.path / name).read_bytes() == (path / name).read_bytes()
    assert [p.name for p in restored.iterdir()] == ["step-00000002"]  # no temp folder left


def test_reupload_is_idempotent_and_latest_only_moves_forward(store, tmp_path):
    local = tmp_path / "checkpoints"
    one, two = make_ckpt(local, 1), make_ckpt(local, 2)
    upload_checkpoint(store, JOB, one)
    upload_checkpoint(store, JOB, two)
    rec = Recorder(store)
    upload_checkpoint(rec, JOB, two)
    assert rec.writes == [f"{JOB}/LATEST"]  # nothing re-uploaded
    rec.writes.clear()
    upload_checkpoint(rec, JOB, one)  # an older step again: LATEST stays
    assert rec.writes == []
    assert store.get_bytes(f"{JOB}/LATEST") == b"step-00000002"


def test_reuploading_a_step_with_new_content_uncommits_it_first(store, tmp_path):
    first = make_ckpt(tmp_path / "a", 5)
    second = make_ckpt(tmp_path / "b", 5)  # same step, different bytes
    upload_checkpoint(store, JOB, first)
    deleted = []

    class Watch(Recorder):
        def put_file(self, key, path, sha256=None):
            # while files are being replaced, step 5 must not look committed
            assert self._store.get_bytes(f"{JOB}/checkpoints/step-00000005/manifest.json") is None
            return super().put_file(key, path, sha256)

        def delete(self, keys):
            deleted.extend(keys)
            return self._store.delete(keys)

    upload_checkpoint(Watch(store), JOB, second)
    assert deleted == [f"{JOB}/checkpoints/step-00000005/manifest.json"]
    out = tmp_path / "out"
    download_checkpoint(store, JOB, 5, out)
    assert (out / "step-00000005" / "model.pt").read_bytes() == (second / "model.pt").read_bytes()


def test_bit_flip_in_newest_is_detected_and_previous_used(store, tmp_path):
    local = tmp_path / "checkpoints"
    for step in (1, 2):
        upload_checkpoint(store, JOB, make_ckpt(local, step))
    flip_a_bit(store, f"{JOB}/checkpoints/step-00000002/model.pt")
    assert latest_committed(store, JOB) == 2  # sizes still match: only sha256 can tell
    with pytest.raises(CorruptCheckpoint, match="model.pt fails its sha256"):
        download_checkpoint(store, JOB, 2, tmp_path / "x")
    assert not (tmp_path / "x" / "step-00000002").exists()
    messages = []
    assert restore_latest(store, JOB, tmp_path / "restored", report=messages.append) == 1
    assert any("step-00000002/model.pt fails its sha256" in m for m in messages)
    assert tc.latest_valid(tmp_path / "restored").step == 1


def test_missing_or_short_objects_and_uncommitted_steps_are_skipped(store, tmp_path):
    local = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        upload_checkpoint(store, JOB, make_ckpt(local, step))
    store.delete([f"{JOB}/checkpoints/step-00000003/optimizer.pt"])
    store.put_bytes(f"{JOB}/checkpoints/step-00000002/model.pt", b"short")
    # a step 4 whose upload died before its manifest, with LATEST already naming it
    store.put_bytes(f"{JOB}/checkpoints/step-00000004/model.pt", b"half")
    store.put_bytes(f"{JOB}/LATEST", b"step-00000004")
    messages = []
    assert latest_committed(store, JOB, report=messages.append) == 1
    text = "\n".join(messages)
    assert "step-00000004, which has no manifest" in text
    assert "optimizer.pt is missing" in text and "model.pt has 5 bytes" in text
    assert restore_latest(store, JOB, tmp_path / "r", report=messages.append) == 1


def test_nothing_committed_is_none_but_unreadable_run_is_an_error(store, tmp_path):
    assert latest_committed(store, JOB) is None
    assert restore_latest(store, JOB, tmp_path / "r") is None
    upload_checkpoint(store, JOB, make_ckpt(tmp_path / "c", 7))
    flip_a_bit(store, f"{JOB}/checkpoints/step-00000007/trainer.pt")
    with pytest.raises(NoWholeCheckpoint, match="1 committed checkpoint.* none downloads"):
        restore_latest(store, JOB, tmp_path / "r", report=lambda m: None)  # a StorageError


def test_uploading_an_uncommitted_local_folder_is_refused(store, tmp_path):
    path = make_ckpt(tmp_path, 3)
    (path / "manifest.json").unlink()
    with pytest.raises(StorageError, match="not a committed checkpoint"):
        upload_checkpoint(store, JOB, path)
    assert store.list(JOB) == []


def test_a_corrupt_local_file_is_not_uploaded(store, tmp_path):
    path = make_ckpt(tmp_path, 3)
    data = bytearray((path / "model.pt").read_bytes())
    data[0] ^= 0xFF
    (path / "model.pt").write_bytes(bytes(data))
    with pytest.raises(StorageError, match="does not match its expected sha256"):
        upload_checkpoint(store, JOB, path)
    assert latest_committed(store, JOB) is None


@pytest.mark.parametrize("steps,keep_last,every,kept", [
    ([], 3, None, []),
    ([100], 3, None, [100]),
    ([100, 200, 300, 400], 2, None, [300, 400]),
    ([100, 200, 300, 400, 500], 2, 200, [200, 400, 500]),
    ([100, 200, 300, 400, 500], 1, 1000, [500]),
    ([500, 1000, 1500, 2000, 2500], 1, 1000, [1000, 2000, 2500]),
    ([3, 1, 2, 2], 2, None, [2, 3]),  # unordered, duplicates
    ([0, 10, 20], 1, 10, [10, 20]),  # step 0 is no milestone
])
def test_retained_steps_table(steps, keep_last, every, kept):
    assert retained_steps(steps, keep_last, every) == kept


def test_retained_steps_rejects_bad_policy():
    with pytest.raises(ValueError):
        retained_steps([1], 0)
    with pytest.raises(ValueError):
        retained_steps([1], 1, 0)


def test_prune_remote_keeps_last_and_milestones(store, tmp_path):
    local = tmp_path / "checkpoints"
    for step in range(100, 1100, 100):
        upload_checkpoint(store, JOB, make_ckpt(local, step, size=10))
    store.put_bytes(f"{JOB}/checkpoints/step-00000150/model.pt", b"orphan")  # uncommitted
    deleted = prune_remote(store, JOB, keep_last=2, milestone_every=500, report=lambda m: None)
    assert deleted == [100, 200, 300, 400, 600, 700, 800]
    assert rc.committed_steps(store, JOB) == [500, 900, 1000]
    left = {k.split("/")[2] for k in store.list(f"{JOB}/checkpoints/")}
    assert left == {"step-00000500", "step-00000900", "step-00001000"}
    assert latest_committed(store, JOB) == 1000


def test_lease_newer_writer_stops_the_older(store, tmp_path):
    old = Lease.acquire(store, JOB, owner="instance-a")
    old.check()
    new = Lease.acquire(store, JOB, owner="instance-b")
    assert (old.epoch, new.epoch) == (1, 2)
    new.check()
    with pytest.raises(LeaseLost, match="instance-b .* at epoch 2") as e:
        old.check()
    assert "\n" not in str(e.value)
    # the zombie's checkpoint is never committed
    with pytest.raises(LeaseLost):
        upload_checkpoint(store, JOB, make_ckpt(tmp_path, 9), lease=old)
    assert latest_committed(store, JOB) is None
    upload_checkpoint(store, JOB, make_ckpt(tmp_path, 9), lease=new)
    assert latest_committed(store, JOB) == 9


def test_lease_same_epoch_race_is_detected_without_conditional_writes(store):
    lease = Lease.acquire(store, JOB, owner="a")
    # another writer that lost the check-then-put race overwrote our epoch object
    store.put_bytes(f"{JOB}/lease/epoch-00000001", json.dumps({"owner": "b"}).encode())
    if store.conditional_writes:
        lease.check()  # cannot happen there: the conditional put would have refused b
    else:
        with pytest.raises(LeaseLost, match="b .* claimed epoch 1"):
            lease.check()


def test_a_superseded_writer_prunes_nothing(store, tmp_path):
    old = Lease.acquire(store, JOB, owner="zombie")
    for step in (1, 2, 3):
        upload_checkpoint(store, JOB, make_ckpt(tmp_path, step, size=10))
    Lease.acquire(store, JOB, owner="relaunch")
    with pytest.raises(LeaseLost):
        prune_remote(store, JOB, keep_last=1, lease=old)
    assert rc.committed_steps(store, JOB) == [1, 2, 3]


def test_concurrent_lease_claims_get_distinct_epochs(store):
    if not store.conditional_writes:
        pytest.skip("without conditional writes a same-epoch race is detected by check()")
    leases, barrier = [], threading.Barrier(4)

    def claim(i):
        barrier.wait()
        leases.append(Lease.acquire(store, JOB, owner=f"w{i}"))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(lease.epoch for lease in leases) == [1, 2, 3, 4]
    newest = max(leases, key=lambda lease: lease.epoch)
    newest.check()
    for lease in leases:
        if lease is not newest:
            with pytest.raises(LeaseLost):
                lease.check()


# --- malformed manifests in the bucket ---------------------------------------------------

def _manifest_edit(edit):
    def damage(raw):
        manifest = json.loads(raw)
        edit(manifest)
        return json.dumps(manifest).encode()
    return damage


def _drop_files(m):
    m["entries"] = m.pop("files")


REMOTE_MALFORMED = {
    "files renamed": _manifest_edit(_drop_files),
    "entry a list": _manifest_edit(lambda m: m["files"].update({"model.pt": [1, 2]})),
    "size a string": _manifest_edit(lambda m: m["files"]["model.pt"].update(size="3000")),
    "sha256 a number": _manifest_edit(lambda m: m["files"]["model.pt"].update(sha256=1)),
    "a path as a name": _manifest_edit(lambda m: m["files"].update(
        {"../../../escape": {"size": 1, "sha256": "0" * 64}})),
    "another step's": _manifest_edit(lambda m: m.update(step=1)),
    "bad JSON": lambda raw: raw[:-5],
    "a JSON list": lambda raw: b"[]",
    "deeply nested": lambda raw: b"[" * 100000 + b"]" * 100000,
}


@pytest.mark.parametrize("damage", REMOTE_MALFORMED.values(), ids=REMOTE_MALFORMED.keys())
def test_a_malformed_remote_manifest_is_skipped_for_the_previous_step(store, tmp_path, damage):
    local = tmp_path / "checkpoints"
    for step in (1, 2):
        upload_checkpoint(store, JOB, make_ckpt(local, step))
    key = f"{JOB}/checkpoints/step-00000002/manifest.json"
    store.put_bytes(key, damage(store.get_bytes(key)))
    messages = []
    assert latest_committed(store, JOB, report=messages.append) == 1
    assert len(messages) == 1 and "step-00000002/manifest.json" in messages[0]
    assert "\n" not in messages[0]
    with pytest.raises(CorruptCheckpoint, match="step-00000002/manifest.json"):
        download_checkpoint(store, JOB, 2, tmp_path / "x")
    restored = tmp_path / "restored"
    assert restore_latest(store, JOB, restored, report=messages.append) == 1
    assert sorted(p.name for p in restored.iterdir()) == ["step-00000001"]
    assert not (tmp_path / "escape").exists()


def test_redownloading_over_a_damaged_local_copy_never_deletes_it_first(
        store, tmp_path, monkeypatch):
    upload_checkpoint(store, JOB, make_ckpt(tmp_path / "src", 3))
    root = tmp_path / "checkpoints"
    damaged = make_ckpt(root, 3)  # another version of step 3 sits where it will go
    seen = []
    real_replace = os.replace

    def watch(src, dst):
        if os.path.basename(src).startswith(".tmp-") and dst == damaged:
            # the old copy is whole under another name until the download is in place
            seen.append([tc.verify(p, 3)["step"] for p in root.iterdir()
                         if p.name.startswith(".old-")])
        return real_replace(src, dst)

    monkeypatch.setattr(tc.os, "replace", watch)
    download_checkpoint(store, JOB, 3, root)
    assert seen == [[3]]
    assert [p.name for p in root.iterdir()] == ["step-00000003"]
    assert (root / "step-00000003" / "model.pt").read_bytes() == \
        (tmp_path / "src" / "step-00000003" / "model.pt").read_bytes()


# --- the background uploader -----------------------------------------------------------

def test_checkpoint_sync_survives_an_unexpected_upload_error(store, tmp_path):
    from runner.storage.sync import CheckpointSync

    class Flaky(Recorder):
        fail = True

        def put_file(self, key, path, sha256=None):
            if Flaky.fail:
                Flaky.fail = False
                raise RuntimeError("boom")
            return super().put_file(key, path, sha256)

    messages = []
    sync = CheckpointSync(Flaky(store), JOB, keep_last=2, milestone_every=None, lease=None,
                          log=messages.append)
    try:
        sync.submit(make_ckpt(tmp_path, 1))
        assert sync.flush(timeout_s=30)
        assert "RuntimeError: boom" in sync.error
        second = make_ckpt(tmp_path, 2)
        sync.submit(second)  # the worker is still alive to take it
        assert sync.flush(timeout_s=30)
        assert sync.commit_now(second)
    finally:
        sync.close()
    assert latest_committed(store, JOB) == 2
    assert any("failed unexpectedly (RuntimeError: boom)" in m for m in messages)


def test_a_checkpoint_pruned_during_its_upload_is_not_called_damaged(store, tmp_path):
    """Issue 45, fault 6: the trainer's pruner removed a checkpoint while its upload (a
    retry queued behind a slow bucket) was reading it: logged "the local checkpoint is
    damaged". It is superseded, not damaged, and is not tried again."""
    from runner.storage.sync import CheckpointSync

    first = make_ckpt(tmp_path, 1)

    class PrunedMidway(Recorder):
        def put_file(self, key, path, sha256=None):
            tc.prune(tmp_path, keep_last=0)  # as the trainer's keep_last does, between files
            return super().put_file(key, path, sha256)

    messages = []
    sync = CheckpointSync(PrunedMidway(store), JOB, keep_last=2, milestone_every=None,
                          lease=None, log=messages.append)
    try:
        sync.submit(first)
        assert sync.flush(timeout_s=30)
    finally:
        sync.close()
    assert messages == ["upload of step-00000001 stopped: pruned here meanwhile (a newer "
                        "checkpoint supersedes it)"]
    assert sync.error is None and latest_committed(store, JOB) is None


class _Planted:
    """Unpickling this creates a file: what someone with write access to the bucket
    could plant in a model.pt (with a manifest to match)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (self.path,))


def test_a_planted_pickle_in_the_bucket_falls_back_to_the_previous_step(store, tmp_path):
    import torch

    src, marker = tmp_path / "src", tmp_path / "pwned"
    for step in (4, 8):
        tc.save(src, step, {"model.pt": {"w": torch.full((3,), float(step))}})
        upload_checkpoint(store, JOB, src / tc.step_name(step))
    planted = tmp_path / "planted"
    tc.save(planted, 8, {"model.pt": {"w": torch.zeros(3), "x": _Planted(marker)}})
    upload_checkpoint(store, JOB, planted / tc.step_name(8))  # a consistent manifest too
    notes = []
    local = tmp_path / "local"
    assert restore_latest(store, JOB, local, report=notes.append,
                          usable=tc.load_problem) == 4
    assert not marker.exists()
    assert tc.committed_steps(local) == [4]  # the refused copy is not left behind
    assert [n for n in notes if "skipping unusable remote checkpoint" in n and
            "step-00000008" in n and "not plain tensors" in n]


def test_latest_naming_an_uncommitted_step_is_repaired_by_the_next_upload(store, tmp_path):
    """Issue 23's fourth fault: a LATEST above every committed step (step-00000099) still
    said 99 after the job finished; a LATEST naming a committed newer step stays."""
    local = tmp_path / "checkpoints"
    store.put_bytes(f"{JOB}/LATEST", b"step-00000099")
    upload_checkpoint(store, JOB, make_ckpt(local, 1))
    assert store.get_bytes(f"{JOB}/LATEST") == b"step-00000001"
    upload_checkpoint(store, JOB, make_ckpt(local, 2))
    upload_checkpoint(store, JOB, local / "step-00000001")  # an older one again
    assert store.get_bytes(f"{JOB}/LATEST") == b"step-00000002"
