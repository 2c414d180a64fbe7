"""Sources: names, local files, the hub code path on local files, and bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ten.data import DataError
from ten.data.sources import KNOWN, HubSource, is_val, open_source, resolve_files


def _texts(source) -> list[str]:
    return [text for _, text in source.documents()]


def test_unknown_name_is_one_line_listing_known(tmp_path):
    with pytest.raises(DataError) as err:
        open_source("fineweb", None, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "'fineweb'" in msg
    for name in KNOWN:
        assert name in msg
    assert "builtin:botocore-docs" in msg


def test_known_names_map_to_hub_locations():
    assert KNOWN["finewebedu"].path == "HuggingFaceFW/fineweb-edu"
    assert KNOWN["finewebedu"].name == "sample-10BT"
    assert KNOWN["wikitext-103"].name == "wikitext-103-raw-v1"
    assert set(KNOWN) == {"finewebedu", "wikitext-103", "wikitext-2", "openwebtext", "pg19",
                          "tinystories", "imdb", "ag_news"}


def test_jsonl_parquet_txt_dir_and_glob(tmp_path, make_docs, write_jsonl):
    docs = make_docs(12)
    write_jsonl(tmp_path / "d" / "a.jsonl", docs[:4], field="body")
    pq.write_table(pa.table({"body": docs[4:8], "n": list(range(4))}), tmp_path / "d" / "b.parquet")
    (tmp_path / "d" / "c.txt").write_text("\n\n".join(docs[8:]) + "\n")
    assert [p.name for p in resolve_files(str(tmp_path / "d"))] == ["a.jsonl", "b.parquet",
                                                                     "c.txt"]
    src = open_source(str(tmp_path / "d"), "body", tmp_path)
    # .txt documents are paragraphs (a blank line ends one); other files: one row each.
    assert _texts(src) == docs
    globbed = open_source(str(tmp_path / "d" / "*.jsonl"), "body", tmp_path)
    assert _texts(globbed) == docs[:4]
    # Restart from a document index (how interrupted preparation resumes).
    assert [t for _, t in src.documents(5)] == docs[5:]


def test_missing_text_field_names_field_and_columns(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "x.jsonl", ["hello"], field="content")
    with pytest.raises(DataError, match=r"no text field 'text' \(available: \['content', 'id'\]"):
        _texts(open_source(str(path), None, tmp_path))
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"'text'.*\['content'\]"):
        _texts(open_source(str(tmp_path / "x.parquet"), None, tmp_path))


@pytest.mark.parametrize("damage", ["not parquet", "magic bytes, garbage inside",
                                    "cut in half"])
def test_a_parquet_file_that_does_not_read_is_a_data_error_naming_it(tmp_path, damage):
    """Issue 23, fault 13: pyarrow's ArrowInvalid reached the runner as a crash (exit 1
    and a traceback); it is the data's fault (exit 3, one line naming the file)."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(2000)]}), path)
    good = path.read_bytes()
    path.write_bytes({"not parquet": b"\x00" * 3000,
                      "magic bytes, garbage inside": b"PAR1" + bytes(range(256)) * 16 + b"PAR1",
                      "cut in half": good[: len(good) // 2]}[damage])
    with pytest.raises(DataError, match=rf"{path}: not a readable parquet file \(.+\)"):
        _texts(open_source(str(path), None, tmp_path))


def test_non_utf8_bytes_are_replaced_not_fatal(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok \xff\xfe bytes"}\n{"text": "clean"}\n')
    assert _texts(open_source(str(path), None, tmp_path)) == ["ok \ufffd\ufffd bytes", "clean"]
    txt = tmp_path / "bad.txt"
    txt.write_bytes(b"caf\xe9 au lait\n")
    assert _texts(open_source(str(txt), None, tmp_path)) == ["caf\ufffd au lait"]


def test_empty_and_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="no .*files match"):
        open_source(str(tmp_path / "nothing" / "*.jsonl"), None, tmp_path)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type 'x.csv'"):
        open_source(str(tmp_path / "x.csv"), None, tmp_path)


def test_split_is_a_pure_function_of_the_key():
    keys = [f"document {i}" for i in range(4000)]
    held = [k for k in keys if is_val(k, 0.1)]
    assert 300 < len(held) < 500
    assert held == [k for k in keys if is_val(k, 0.1)]
    assert not any(is_val(k, 0.0) for k in keys)


def test_hub_code_path_on_local_files_same_schema(tmp_path, make_docs):
    """The real datasets.load_dataset path, pointed at a parquet file shaped like the hub's."""
    docs = make_docs(20)
    pq.write_table(pa.table({"text": docs, "id": list(range(20))}), tmp_path / "fw.parquet")
    src = open_source("finewebedu", None, tmp_path, data_files=str(tmp_path / "fw.parquet"))
    assert isinstance(src, HubSource) and src.text_field == "text"
    assert _texts(src) == docs
    assert [t for _, t in src.documents(15)] == docs[15:]
    ds = src.to_dataset(tmp_path)  # download mode: non-streaming load_dataset
    assert ds.column_names == ["text"] and ds["text"] == docs
    wrong = open_source("finewebedu", "content", tmp_path, data_files=str(tmp_path / "fw.parquet"))
    with pytest.raises(DataError, match=r"no text field 'content' \(available: \['id', 'text'\]"):
        _texts(wrong)


def test_local_fingerprint_changes_when_file_changes(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "a.jsonl", ["one"])
    before = open_source(str(path), None, tmp_path).fingerprint()
    assert open_source(str(path), None, tmp_path).fingerprint() == before
    write_jsonl(path, ["one", "two"])
    assert open_source(str(path), None, tmp_path).fingerprint() != before
    assert open_source(str(path), "other", tmp_path).fingerprint() != before


def test_non_text_field_is_an_error(tmp_path):
    path = Path(tmp_path / "n.jsonl")
    path.write_text('{"text": 5}\n')
    with pytest.raises(DataError, match="holds int, not text"):
        _texts(open_source(str(path), None, tmp_path))
