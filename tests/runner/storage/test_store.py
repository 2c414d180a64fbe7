"""The Store interface, run against a local directory, moto and rclone alike."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from runner.storage import StorageError, open_store
from runner.storage.local import LocalStore


def test_bytes_roundtrip_head_list_delete(store, request):
    # rclone 1.75 stalls the request after a zero-length PUT on the same connection
    # until the read timeout (a server quirk), so it gets a one-byte object instead.
    small = b"z" if request.node.callspec.params["store"] == "rclone" else b""
    assert store.get_bytes("a/b.txt") is None
    assert store.head("a/b.txt") is None
    assert store.put_bytes("a/b.txt", b"hello") is True
    assert store.get_bytes("a/b.txt") == b"hello"
    assert store.head("a/b.txt").size == 5
    store.put_bytes("a/c/d.bin", small)
    store.put_bytes("ab", b"x")
    assert store.list("a/") == ["a/b.txt", "a/c/d.bin"]
    assert store.list("a") == ["a/b.txt", "a/c/d.bin", "ab"]
    assert store.list("") == ["a/b.txt", "a/c/d.bin", "ab"]
    assert store.list("zzz/") == []
    store.delete(["a/b.txt", "a/missing"])
    assert store.list("a/") == ["a/c/d.bin"]
    assert store.get_bytes("a/c/d.bin") == small


def test_put_bytes_overwrites_unless_if_absent(store):
    assert store.put_bytes("k", b"1", if_absent=True) is True
    assert store.put_bytes("k", b"2", if_absent=True) is False
    assert store.get_bytes("k") == b"1"
    assert store.put_bytes("k", b"3") is True
    assert store.get_bytes("k") == b"3"


def test_conditional_writes_detected(store, request):
    kind = request.node.callspec.params["store"]
    assert store.conditional_writes is (kind != "rclone")


@pytest.mark.parametrize("size", [1, 1000, (5 << 20) * 2 + 12345])  # the last: 3 parts
def test_file_roundtrip(store, tmp_path, size):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    info = store.put_file("files/blob.bin", src)
    assert info.size == size
    assert store.head("files/blob.bin").size == size
    dst = tmp_path / "out" / "blob.bin"
    store.get_file("files/blob.bin", dst)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["blob.bin"]  # no temp left


def test_put_file_refuses_a_local_file_that_does_not_match(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"abc")
    with pytest.raises(StorageError, match="does not match"):
        store.put_file("x", src, sha256="0" * 64)
    assert store.head("x") is None


def test_get_missing_file_is_a_storage_error(store, tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        store.get_file("nope/x.bin", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()


def test_keys_are_validated(store):
    for bad in ["", "/abs", "a//b", "a/../b", "./a"]:
        with pytest.raises(ValueError):
            store.put_bytes(bad, b"x")


def test_url_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("./runs"), LocalStore)
    assert open_store("./runs").root == tmp_path / "runs"
    assert open_store(f"file://{tmp_path}/r").root == tmp_path / "r"
    for bad, msg in [("", "empty"), ("gs://b/x", "unsupported scheme"),
                     ("file://relative", "absolute"), ("s3://", "needs a bucket"),
                     ("s3://AKIA:secret@bucket/x", "needs a bucket")]:
        with pytest.raises(StorageError, match=msg) as e:
            open_store(bad)
        assert "secret" not in str(e.value)
    with pytest.raises(StorageError, match="endpoint_url"):
        open_store("./runs", endpoint_url="http://x")


def test_local_if_absent_is_atomic_under_threads(tmp_path):
    store = LocalStore(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        store.put_bytes("lock", str(i).encode(), if_absent=True))) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert not [p for p in Path(tmp_path).iterdir() if p.name != "lock"]


@pytest.mark.parametrize("kind", ["moto", "rclone"])
@pytest.mark.parametrize("size", [1000, (5 << 20) * 2 + 12345])
def test_upload_is_verified_by_etag_without_reading_it_back(s3_store, kind, size, tmp_path):
    """Single-part (MD5) and multipart (md5-of-part-md5s-N on moto, whole MD5 on rclone)
    ETags both match what we compute locally, so no GetObject is needed to verify."""
    store = s3_store(kind)
    reads = []
    store.client.meta.events.register("before-send.s3.GetObject",
                                      lambda **kw: reads.append(1))
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(size))
    info = store.put_file("f.bin", src)
    assert info.size == size and info.etag
    assert reads == []


def test_local_store_hides_temporaries_and_removes_empty_folders(tmp_path):
    store = LocalStore(tmp_path)
    store.put_bytes("a/b/c", b"1")
    (tmp_path / "a" / "b" / ".tmp-c-1-x").write_bytes(b"partial")
    assert store.list("a/") == ["a/b/c"]
    (tmp_path / "a" / "b" / ".tmp-c-1-x").unlink()
    store.delete(["a/b/c"])
    assert list(tmp_path.iterdir()) == []


def test_opaque_etags_fall_back_to_a_sha256_read_back(s3_store, tmp_path):
    """Servers whose ETag is no MD5 (SSE-KMS, some S3-compatibles): the object is read
    back and its sha256 compared instead, and an object that is not the file is refused.
    (Our own head() is wrapped; boto3 is not.)"""
    from runner.storage.base import ObjectInfo

    store = s3_store("moto")
    real_head = store.head
    store.head = lambda key: (lambda i: i and ObjectInfo(i.size, "opaque"))(real_head(key))
    reads = []
    store.client.meta.events.register("before-send.s3.GetObject",
                                      lambda **kw: reads.append(1))
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(3000))
    store.put_file("f.bin", src)
    assert len(reads) == 1  # read back once, and it matched

    # Another writer replaces the object (same size) between the upload and the read-back:
    # the read-back is what catches it.
    def replace(**kw):
        store.client.meta.events.unregister("before-send.s3.GetObject", replace)
        store.put_bytes("g.bin", os.urandom(3000))
    store.client.meta.events.register("before-send.s3.GetObject", replace)
    with pytest.raises(StorageError, match="sha256 differs"):
        store.put_file("g.bin", src)


def test_importing_the_store_pulls_neither_boto3_nor_torch():
    import subprocess
    import sys

    code = ("import sys, runner.storage, runner.storage.checkpoints, runner.storage.datasets; "
            "print('boto3' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


def test_removing_a_folder_that_gains_a_file_meanwhile_goes_over_it_again(tmp_path,
                                                                         monkeypatch):
    # rm --force of a run still writing: a file created between rmtree's listing and its
    # rmdir failed the removal with "Directory not empty" (exit 4)
    import shutil

    store = LocalStore(tmp_path)
    store.put_bytes("run/a", b"x")
    real, late = shutil.rmtree, []

    def rmtree_while_a_writer_adds_one_file(path, *a, **k):
        if not late:
            late.append((Path(path) / "last-line").write_bytes(b"y"))
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", rmtree_while_a_writer_adds_one_file)
    store.delete_folder("run")
    assert not (tmp_path / "run").exists() and late
