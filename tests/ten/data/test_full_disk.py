"""A full cache disk is a one-line DataError naming the file and its free space, leaves
no temp files, and once space is freed the same preparation carries on and succeeds."""

from __future__ import annotations

import gzip
import json

import pytest

from ten.data import DataError, builtin, open_data
from ten.data import prepare as prep

NO_SPACE = "No space left on device"


@pytest.fixture
def small_chunks(monkeypatch):
    """Many small committed units of work, so the failure lands mid-way through."""
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)
    monkeypatch.setattr(prep, "COMMIT_EVERY_S", 0.0)


def _fill(disk, leave_kib: int):
    """A filler file that leaves about ``leave_kib`` free on ``disk``."""
    import shutil

    free = shutil.disk_usage(disk).free
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (free - leave_kib * 1024))
    return filler


def _hidden_temps(root):
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def _shards(data):
    return {p.name: p.read_bytes() for p in sorted(data.prepared_dir.glob("*.bin"))}


@pytest.mark.parametrize("num_proc", [1, 2])
def test_shards_on_a_full_disk_then_freed(cfg, small_disk, small_chunks, num_proc):
    clean = open_data(cfg.replace(num_proc=num_proc))  # on the roomy disk
    disk = small_disk(512)
    full = cfg.replace(cache_dir=str(disk), num_proc=num_proc)
    filler = _fill(disk, 48)  # room for the tokenizer (~6 KB), not the shards (~84 KB)
    with pytest.raises(DataError) as err:
        open_data(full)
    msg = str(err.value)
    assert "\n" not in msg and NO_SPACE in msg and f"free on {disk}" in msg
    assert f"cannot write {disk}/shards/" in msg and "DataConfig.cache_dir" in msg
    assert _hidden_temps(disk) == []
    filler.unlink()  # space freed: the same call now finishes the job
    again = open_data(full)
    assert _shards(again) == _shards(clean)


def test_tokenizer_on_a_full_disk_names_the_model_file(cfg, small_disk):
    disk = small_disk(256)
    filler = _fill(disk, 0)
    full = cfg.replace(cache_dir=str(disk))
    with pytest.raises(DataError, match=NO_SPACE) as err:
        open_data(full)
    msg = str(err.value)
    assert f"cannot write {disk}/tokenizers/" in msg and "tokenizer.model" in msg
    assert _hidden_temps(disk) == []
    filler.unlink()
    assert open_data(full).tokenizer.vocab_size == cfg.tokenizer.vocab_size


@pytest.mark.parametrize("num_proc, leave_kib", [(1, 48), (2, 260)])
def test_download_mode_on_a_full_disk(cfg, small_disk, num_proc, leave_kib):
    """datasets writes its own cache there (48 KiB: its generation step fails; 260: its
    map worker processes do) and wraps the OSError: still one line naming its folder."""
    disk = small_disk(4096)
    full = cfg.replace(cache_dir=str(disk), mode="download", num_proc=num_proc)
    filler = _fill(disk, leave_kib)
    with pytest.raises(DataError, match=NO_SPACE) as err:
        open_data(full)
    msg = str(err.value)
    assert f"cannot write {disk}/hf" in msg and f"free on {disk}" in msg and "\n" not in msg
    filler.unlink()
    assert _shards(open_data(full)) == _shards(open_data(cfg))


def test_builtin_corpus_extraction_on_a_full_disk(tmp_path, small_disk, monkeypatch):
    data_dir = tmp_path / "botocore-data"
    for i in range(12):  # ~60 KB of prose in all: more than the disk holds
        path = data_dir / f"svc{i:02d}" / "2020-01-01" / "service-2.json.gz"
        path.parent.mkdir(parents=True)
        docs = {f"Op{j}": {"documentation": f"<p>Service {i} operation {j} " + "word " * 80}
                for j in range(12)}
        with gzip.open(path, "wt") as f:
            json.dump({"operations": docs}, f)
    monkeypatch.setattr(builtin, "botocore_data_dir", lambda: (data_dir, "9.9"))
    disk = small_disk(32)
    with pytest.raises(DataError, match=NO_SPACE) as err:
        builtin.corpus_path(disk)
    assert f"cannot write {disk}/builtin/botocore-docs-9.9" in str(err.value)
    assert _hidden_temps(disk) == []
    roomy = small_disk(256)
    assert builtin.corpus_path(roomy).stat().st_size > 32 * 1024


def test_a_read_only_cache_disk_is_one_line(cfg, small_disk):
    import subprocess

    disk = small_disk(256)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    with pytest.raises(DataError, match="Read-only file system") as err:
        open_data(cfg.replace(cache_dir=str(disk)))
    msg = str(err.value)
    assert f"cannot write {disk}/tokenizers" in msg and "at a writable disk" in msg
    assert "DataConfig.cache_dir (or TEN_CACHE_DIR)" in msg and "\n" not in msg


def test_only_environment_errors_become_data_errors(tmp_path):
    """A missing file is a bug (traceback kept); a permission error, even wrapped in
    another library's exception, is one line with its own hint."""
    import errno

    from ten.data.errors import disk_errors

    with pytest.raises(FileNotFoundError), disk_errors(tmp_path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x")
    with pytest.raises(DataError) as err, disk_errors(tmp_path, what="access"):
        try:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "f"))
        except OSError as e:
            raise RuntimeError("wrapped by a library") from e
    assert str(err.value).startswith(f"cannot access {tmp_path / 'f'}: Permission denied (")
    assert str(err.value).endswith("; fix its permissions, or point DataConfig.cache_dir "
                                   "(or TEN_CACHE_DIR) elsewhere")
