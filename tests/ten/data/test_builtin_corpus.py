"""builtin:botocore-docs: extracted from botocore's files by path, cached, fixed split."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ten.data import DataConfig, TokenizerConfig, builtin, open_data
from ten.data.sources import BuiltinSource, is_val


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("builtin-cache")
    builtin.corpus_path(path)  # the one extraction (a few seconds)
    return path


def test_clean_html():
    raw = ("<p>Creates a <code>Bucket</code> &amp; returns its ARN.</p><ul><li>one</li>"
           "<li>two&nbsp;items</li></ul>  <p/>")
    assert builtin.clean_html(raw) == "Creates a Bucket & returns its ARN.\none\ntwo items"


def test_corpus_is_deduplicated_sorted_prose(cache):
    path = builtin.corpus_path(cache)
    rows = [json.loads(line) for line in path.read_text().split("\n") if line]
    keys = [r["key"] for r in rows]
    assert keys == sorted(keys) and len(set(keys)) == len(keys) and len(keys) > 300
    assert {"s3", "ec2", "lambda", "dynamodb"} <= set(keys)
    size = sum(len(r["text"].encode()) for r in rows)
    assert size > 15e6  # ~27 MB with botocore 1.43
    paragraphs = [p for r in rows for p in r["text"].split("\n\n")]
    assert len(paragraphs) == len(set(paragraphs))  # deduplicated across services
    assert min(map(len, paragraphs)) >= builtin.MIN_CHARS
    sample = "".join(r["text"] for r in rows[:50])
    assert "<p>" not in sample and "&amp;" not in sample


def test_extraction_is_cached(cache):
    path = builtin.corpus_path(cache)
    mtime = path.stat().st_mtime_ns
    assert builtin.corpus_path(cache) == path and path.stat().st_mtime_ns == mtime
    assert builtin.botocore_data_dir()[1] in path.name


def test_fixed_held_out_split_by_service_name(cache):
    source = BuiltinSource(cache_dir=cache)
    held = [k for k, _ in source.documents() if is_val(k, source.fixed_val_fraction)]
    assert 3 <= len(held) <= 40
    data = open_data(DataConfig(mode="streaming", cache_dir=str(cache),
                                tokenizer=TokenizerConfig(vocab_size=400, sample_chars=200_000),
                                seq_len=32, val_fraction=0.5, max_documents=40, progress=False))
    assert data.fraction == builtin.VAL_FRACTION  # the job's val_fraction does not move it


def test_streams_without_importing_boto(cache):
    code = (
        "import sys\n"
        "from ten.data import DataConfig, TokenizerConfig, open_data\n"
        f"cfg = DataConfig(mode='streaming', cache_dir={str(cache)!r},\n"
        "                 tokenizer=TokenizerConfig(vocab_size=400, sample_chars=100_000),\n"
        "                 seq_len=32, max_documents=20, progress=False)\n"
        "batch = next(iter(open_data(cfg).train_loader(batch_size=2, num_workers=1)))\n"
        "assert tuple(batch.shape) == (2, 33)\n"
        "bad = {'boto3', 'botocore', 'runner', 'click'} & {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_extraction_rules_on_a_small_copy(tmp_path):
    """Newest API version only, cross-service dedup, same output with 1 or 2 processes."""
    import gzip

    def service(name, version, docs):
        spec = {"documentation": docs[0],
                "operations": {f"Op{i}": {"documentation": d} for i, d in enumerate(docs[1:])},
                "shapes": {"S": {"members": {"m": {"documentation": "<p>short</p>"}}}}}
        path = tmp_path / name / version / "service-2.json.gz"
        path.parent.mkdir(parents=True)
        with gzip.open(path, "wt") as f:
            json.dump(spec, f)

    shared = "<p>This sentence is shared by two services and long enough to keep.</p>"
    service("alpha", "2015-01-01", ["<p>Old alpha text that must not appear at all.</p>"])
    service("alpha", "2020-01-01", ["<p>Alpha is the first service, described here.</p>",
                                    shared])
    service("beta", "2019-01-01",
            [shared, "<b>Beta</b> has its own words &amp; more text, long enough."])
    one = list(builtin.extract(tmp_path, processes=1))
    assert one == list(builtin.extract(tmp_path, processes=2))
    kept = "This sentence is shared by two services and long enough to keep."
    assert one == [
        {"key": "alpha", "text": "Alpha is the first service, described here.\n\n" + kept},
        {"key": "beta", "text": "Beta has its own words & more text, long enough."}]
