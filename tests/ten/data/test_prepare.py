"""Pre-tokenize-and-pack: exact stream, parallel == serial, idempotent, resumable."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ten.data import DataError, open_data
from ten.data import prepare as prep
from ten.data.sources import is_val


@pytest.fixture
def small_chunks(monkeypatch):
    """Many small units of work, each committed, so parallelism and resumption are
    really exercised."""
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)
    monkeypatch.setattr(prep, "COMMIT_EVERY_S", 0.0)


def _shas(directory):
    m = json.loads((directory / "manifest.json").read_text())
    return {name: [s["sha256"] for s in split["shards"]] for name, split in m["splits"].items()}


def test_stream_is_documents_with_eos_between_no_padding(cfg, docs):
    # Shards far smaller than most documents: the stream just continues in the next file.
    data = open_data(cfg.replace(shard_tokens=97))
    assert len(data.manifest["splits"]["train"]["shards"]) > 100
    tok = data.tokenizer
    expect = {"train": [], "val": []}
    for d in docs:
        expect["val" if is_val(d, cfg.val_fraction) else "train"] += tok.encode(d) + [tok.eos_id]
    assert data.train.read(0, len(data.train)).tolist() == expect["train"]
    assert data.val.read(0, len(data.val)).tolist() == expect["val"]
    counts = data.manifest["documents"]
    assert counts["train_docs"] + counts["val_docs"] == len(docs)
    assert 0 < counts["val_docs"] < len(docs) * 0.25
    train = data.manifest["splits"]["train"]
    assert train["sequences"] == (train["tokens"] - 1) // cfg.seq_len
    # 2 bytes per token on disk (uint16) plus one 64-byte header per shard.
    size = sum(s["bytes"] for s in train["shards"])
    assert size == 2 * train["tokens"] + 64 * len(train["shards"])


def test_parallel_equals_serial(cfg, tmp_path, small_chunks):
    one = open_data(cfg.replace(shard_tokens=5000))
    two = open_data(cfg.replace(shard_tokens=5000, num_proc=2,
                                cache_dir=str(tmp_path / "two")))
    assert _shas(one.prepared_dir) == _shas(two.prepared_dir)
    assert len(_shas(one.prepared_dir)["train"]) > 2


def test_idempotent_reuse_does_no_work(cfg):
    first = open_data(cfg)
    mtimes = {p: p.stat().st_mtime_ns for p in first.prepared_dir.iterdir()}
    calls = []
    again = open_data(cfg, on_commit=calls.append)
    assert calls == [] and again.prepared_dir == first.prepared_dir
    assert {p: p.stat().st_mtime_ns for p in again.prepared_dir.iterdir()} == mtimes
    assert again.fingerprint == first.fingerprint
    # A different seq_len is a different preparation (the manifest records it).
    assert open_data(cfg.replace(seq_len=16)).fingerprint != first.fingerprint


def test_progress_to_a_file_is_plain_lines_not_a_bar(cfg, monkeypatch, capsys):
    """stderr that is no terminal (a container's log) gets whole lines: a tqdm bar's
    carriage returns ran into the log lines around it."""
    monkeypatch.setattr(prep, "CHUNK_CHARS", 3000)
    monkeypatch.setattr(prep, "PLAIN_EVERY_S", 0.0)
    open_data(cfg.replace(progress=True))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tokenizing ")]
    assert "\r" not in err and len(lines) > 2, err
    size = f" of {os.path.getsize(cfg.dataset) / 1e6:,.1f} MB, "
    assert all(size in ln for ln in lines[:-1])  # against the input's size: an estimate
    tokens = json.loads((open_data(cfg).prepared_dir / "manifest.json").read_text())
    total = sum(split["tokens"] for split in tokens["splits"].values())
    assert f"M characters, {total:,} tokens, " in lines[-1]  # the end: what it made


def test_the_data_describes_its_documents_tokens_and_split(cfg, docs):
    """The line a run prints before step 1, as ``python -m ten.data prepare`` does."""
    data = open_data(cfg)
    train, val = (data.manifest["splits"][s] for s in ("train", "val"))
    assert data.describe() == (
        f"{len(docs):,} documents, {train['tokens'] + val['tokens']:,} tokens: train "
        f"{train['tokens']:,} ({train['documents']:,} documents, {train['sequences']:,} "
        f"sequences of 32), held out {val['tokens']:,} ({val['documents']:,} documents)")
    stream = open_data(cfg.replace(mode="streaming", max_documents=100))
    assert stream.describe().endswith(", the first 100 documents, tokenized as it is read; "
                                      "about 10.0% of documents held out")


class _Interrupt(Exception):
    pass


def _interrupt_after(n):
    seen = []

    def hook(progress):
        seen.append(progress["rows"])
        if len(seen) == n:
            raise _Interrupt

    return hook


@pytest.mark.parametrize("num_proc", [1, 2])
def test_interrupted_preparation_resumes_without_duplicates(cfg, tmp_path, small_chunks,
                                                            num_proc):
    cfg = cfg.replace(shard_tokens=3000, num_proc=num_proc)
    clean = open_data(cfg.replace(cache_dir=str(tmp_path / "clean")))
    with pytest.raises(_Interrupt):
        open_data(cfg, on_commit=_interrupt_after(4))
    directory = clean.prepared_dir.parent.parent.parent / "cache" / "shards" / \
        clean.prepared_dir.name
    progress = json.loads((directory / "progress.json").read_text())
    assert not (directory / "manifest.json").exists() and progress["rows"] > 0
    # Simulate a crash mid-chunk: bytes past the committed point, and a stray next shard.
    open_name = f"train-{len(progress['writers']['train']['shards']):06d}.bin"
    with open(directory / open_name, "ab") as f:
        f.write(b"\x01\x02" * 777)
    (directory / "train-000099.bin").write_bytes(b"junk")
    calls = []
    resumed = open_data(cfg, on_commit=calls.append)
    assert calls and calls[0]["rows"] > progress["rows"]  # continued, did not restart
    assert _shas(resumed.prepared_dir) == _shas(clean.prepared_dir)
    assert resumed.manifest["documents"] == clean.manifest["documents"]
    assert not (directory / "progress.json").exists()
    assert not (directory / "train-000099.bin").exists()


def _die(chunk):
    os._exit(1)


def test_a_dying_worker_is_an_error_not_a_hang(cfg, small_chunks, monkeypatch):
    monkeypatch.setattr(prep, "tokenize_chunk", _die)
    with pytest.raises(DataError, match="worker process died"):
        open_data(cfg.replace(num_proc=2))


def test_empty_documents_skipped_and_counted(cfg, tmp_path, docs, write_jsonl):
    path = write_jsonl(tmp_path / "e.jsonl", [docs[0], "", "   \n ", docs[1], ""])
    data = open_data(cfg.replace(dataset=str(path), val_fraction=0.0,
                                 tokenizer=cfg.tokenizer.replace(
                                     path=str(open_data(cfg).tokenizer.path))))
    assert data.manifest["documents"]["skipped_empty"] == 3
    assert data.manifest["documents"]["train_docs"] == 2
    tok = data.tokenizer
    assert data.train.read(0, len(data.train)).tolist() == \
        tok.encode(docs[0]) + [tok.eos_id] + tok.encode(docs[1]) + [tok.eos_id]


def test_empty_source_is_an_error(cfg, tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", " "])
    with pytest.raises(DataError, match="no non-empty training documents"):
        open_data(cfg.replace(dataset=str(path)))
    given = open_data(cfg).tokenizer.path
    with pytest.raises(DataError, match="has no non-empty documents.*2 rows read"):
        open_data(cfg.replace(dataset=str(path),
                              tokenizer=cfg.tokenizer.replace(path=str(given))))
    (tmp_path / "blank.txt").write_text("")
    with pytest.raises(DataError):
        open_data(cfg.replace(dataset=str(tmp_path / "blank.txt")))


def test_invalid_utf8_is_replaced_and_counted(cfg, tmp_path, docs, capfd):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}).encode() for d in docs[:30]]
    lines[3] = b'{"text": "broken \xff\xfe bytes here"}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    data = open_data(cfg.replace(dataset=str(path), val_fraction=0.0))
    assert data.manifest["documents"]["invalid_utf8"] == 1
    assert f"1 document of {path} contains U+FFFD" in capfd.readouterr().err
    assert "broken \ufffd\ufffd bytes here" in data.tokenizer.decode(
        data.train.read(0, len(data.train)).tolist())


def test_the_invalid_utf8_warning_stands_on_its_own_line_after_the_bar(cfg, tmp_path, docs,
                                                                       capfd):
    """Printed while the progress bar was still open, the warning ran on from the
    bar's line ("...tok/s]ten.data: 1 document...")."""
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}).encode() for d in docs[:30]]
    lines[3] = b'{"text": "broken \xff\xfe bytes here"}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    open_data(cfg.replace(dataset=str(path), val_fraction=0.0, progress=True))
    err = capfd.readouterr().err
    assert "tokenizing" in err  # the bar was drawn
    (line,) = [line for line in err.split("\n") if "U+FFFD" in line]
    assert line.startswith(f"ten.data: 1 document of {path} contains U+FFFD")
    assert err.index("U+FFFD") > err.rindex("tokenizing")


def test_a_lone_surrogate_is_replaced_and_counted_not_fatal(cfg, tmp_path, docs):
    """Issue 23, fault 15: one JSON document spelling a lone surrogate ("\\ud800") among
    good ones failed tokenizer training for the whole job (a pybind11 message)."""
    path = tmp_path / "surrogate.jsonl"
    lines = [json.dumps({"text": d}) for d in docs[:30]]
    lines[5] = '{"text": "lone \\ud800 surrogate"}'
    path.write_text("\n".join(lines) + "\n")
    data = open_data(cfg.replace(dataset=str(path), val_fraction=0.0))
    assert data.manifest["documents"]["invalid_utf8"] == 1
    assert "lone \ufffd surrogate" in data.tokenizer.decode(
        data.train.read(0, len(data.train)).tolist())


def test_download_mode_writes_identical_shards(cfg, tmp_path):
    pre = open_data(cfg)
    down = open_data(cfg.replace(mode="download", cache_dir=str(tmp_path / "down"),
                                 tokenizer=cfg.tokenizer.replace(path=str(pre.tokenizer.path))))
    assert down.manifest["mode"] == "download"
    assert _shas(down.prepared_dir) == _shas(pre.prepared_dir)
    assert down.manifest["documents"] == pre.manifest["documents"]


def test_download_mode_cursor_restores_with_workers(cfg, tmp_path):
    down = open_data(cfg.replace(mode="download", shuffle=True))
    loader = down.train_loader(batch_size=4, num_workers=2)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [next(it) for _ in range(3)]
    fresh = open_data(cfg.replace(mode="download", shuffle=True)).train_loader(4, num_workers=1)
    fresh.load_state_dict(state)
    it2 = iter(fresh)
    assert all(torch.equal(next(it2), e) for e in expected)


def test_download_mode_empty_source_is_an_error(cfg, tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", " "])
    given = open_data(cfg).tokenizer.path
    with pytest.raises(DataError, match="no non-empty documents"):
        open_data(cfg.replace(dataset=str(path), mode="download",
                              tokenizer=cfg.tokenizer.replace(path=str(given))))


def test_download_mode_through_the_hub_path(cfg, tmp_path, make_docs):
    docs = make_docs(60, seed=3)
    pq.write_table(pa.table({"text": docs}), tmp_path / "tiny.parquet")
    hub = cfg.replace(dataset="tinystories", data_files=str(tmp_path / "tiny.parquet"))
    pre = open_data(hub)
    down = open_data(hub.replace(mode="download", num_proc=2, cache_dir=str(tmp_path / "d"),
                                 tokenizer=hub.tokenizer.replace(path=str(pre.tokenizer.path))))
    assert _shas(down.prepared_dir) == _shas(pre.prepared_dir)
    assert pre.manifest["documents"]["rows_read"] == 60


def test_max_documents_caps_the_source(cfg):
    data = open_data(cfg.replace(max_documents=50))
    assert data.manifest["documents"]["rows_read"] == 50


def test_progress_bar_reports_tokens_per_second(cfg, capsys):
    open_data(cfg.replace(progress=True))
    err = capsys.readouterr().err
    assert "tokenizing" in err and "tok/s" in err
