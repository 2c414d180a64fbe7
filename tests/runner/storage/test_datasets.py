"""The prepared-data cache: commit marker last, concurrent preparers, verification."""

from __future__ import annotations

import json
import os
import threading

import pytest

from runner.storage.datasets import download_dataset, is_committed, upload_dataset

FP = "finewebedu-4096-bpe-3f2a9c"


def make_dataset(root, tag: bytes, size=4000):
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "train-000.bin").write_bytes(tag + os.urandom(size))
    (root / "shards" / "val-000.bin").write_bytes(tag + os.urandom(size // 4))
    (root / "tokenizer.model").write_bytes(tag * 10)
    return root


def tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_roundtrip_and_second_upload_is_a_no_op(store, tmp_path):
    src = make_dataset(tmp_path / "src", b"A")
    assert download_dataset(store, FP, tmp_path / "none") is False
    assert upload_dataset(store, FP, src) is True
    assert is_committed(store, FP)
    assert upload_dataset(store, FP, make_dataset(tmp_path / "other", b"B")) is False
    out = tmp_path / "cache" / FP
    assert download_dataset(store, FP, out) is True
    assert tree(out) == tree(src)
    assert [p.name for p in out.parent.iterdir()] == [FP]  # no temp folder left
    marker = json.loads(store.get_bytes(f"datasets/{FP}/COMMITTED"))
    assert marker["files"]["tokenizer.model"]["size"] == 10


def test_files_without_a_marker_are_not_a_cache(store, tmp_path):
    store.put_bytes(f"datasets/{FP}/parts-x/tokenizer.model", b"half")
    assert download_dataset(store, FP, tmp_path / "out") is False
    assert not (tmp_path / "out").exists()


def test_two_preparers_at_once_never_mix(store, tmp_path):
    sources = [make_dataset(tmp_path / f"src{i}", tag) for i, tag in enumerate([b"A", b"B"])]
    results = [None, None]
    barrier = threading.Barrier(2)

    def prepare(i):
        barrier.wait()
        results[i] = upload_dataset(store, FP, sources[i])

    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if store.conditional_writes:
        assert sorted(results) == [False, True]
    else:
        assert True in results
    out = tmp_path / "out"
    assert download_dataset(store, FP, out) is True
    assert tree(out) in (tree(sources[0]), tree(sources[1]))  # one writer's set, whole


def test_a_corrupt_cache_is_reported_and_not_used(store, tmp_path):
    upload_dataset(store, FP, make_dataset(tmp_path / "src", b"A"))
    key = next(k for k in store.list(f"datasets/{FP}/") if k.endswith("train-000.bin"))
    data = bytearray(store.get_bytes(key))
    data[100] ^= 0x10
    store.put_bytes(key, bytes(data))
    messages = []
    out = tmp_path / "out"
    assert download_dataset(store, FP, out, report=messages.append) is False
    assert "train-000.bin fails its size/sha256 check" in messages[0]
    assert not out.exists() or not any(out.rglob("*"))


def test_fingerprints_are_validated(store, tmp_path):
    with pytest.raises(ValueError):
        upload_dataset(store, "../escape", tmp_path)


def test_local_lock_and_temporary_files_are_not_shared(store, tmp_path):
    src = make_dataset(tmp_path / "src", b"A")
    (src / ".lock").write_bytes(b"")  # the tokenizer's file lock
    (src / "shards" / ".tmp-train-001.bin").write_bytes(b"half-written")
    assert upload_dataset(store, FP, src) is True
    marker = json.loads(store.get_bytes(f"datasets/{FP}/COMMITTED"))
    assert sorted(marker["files"]) == ["shards/train-000.bin", "shards/val-000.bin",
                                       "tokenizer.model"]


def test_the_shared_manifest_names_no_resolved_variable(store, tmp_path):
    """ten.data's manifest records the dataset as the job resolved it (``command``,
    ``source.name``): the bucket's copy goes through the job's scrub, as every log line
    does (issue 23, fault 18). The scrubbed copy is what the marker verifies."""
    src = make_dataset(tmp_path / "src", b"A")
    secret = "s3://private-bucket-7Qx/corpus.jsonl"
    manifest = {"command": f"ten.data prepare --dataset {secret}",
                "source": {"name": secret, "fingerprint": "f"}}
    (src / "shards" / "manifest.json").write_text(json.dumps(manifest))
    assert upload_dataset(store, FP, src, scrub=lambda text: text.replace(secret, "***"))
    shared = [k for k in store.list(f"datasets/{FP}/") if k.endswith("manifest.json")]
    assert len(shared) == 1 and secret.encode() not in store.get_bytes(shared[0])
    out = tmp_path / "out"
    assert download_dataset(store, FP, out) is True  # verifies against the scrubbed copy
    assert json.loads((out / "shards" / "manifest.json").read_text())["source"]["name"] == "***"
    assert (src / "shards" / "manifest.json").read_text() == json.dumps(manifest)  # untouched
