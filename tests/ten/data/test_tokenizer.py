"""The sentencepiece tokenizer: exact round trips, exact fast encoding, caching."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import sentencepiece as spm

from ten.data import DataError, Tokenizer
from ten.data.pipeline import open_tokenizer
from ten.data.sources import open_source
from ten.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train

ODD = ["", "\n", "\n\n  leading spaces\tand tabs  \n", "日本語のテキスト and emoji 🚀",
       "trailing newline\n", "x" * 5000, "digits 1234567890 and café",
       "A paragraph. With sentences,\nline breaks\n\nand a blank line; the model's text.",
       "  indented\n\tcode = {'a': [1, 2]}  # comment\n"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory, make_docs) -> Tokenizer:
    path = tmp_path_factory.mktemp("tok") / "t.model"
    train(make_docs(200, seed=1), path, vocab_size=400)
    return Tokenizer(path)


def test_reserved_ids_and_dtype(tok):
    assert (tok.pad_id, tok.eos_id) == (PAD_ID, EOS_ID)
    assert (tok.unk_id, tok.bos_id) == (UNK_ID, BOS_ID)
    assert tok.vocab_size == 400 and tok.dtype == np.uint16


@pytest.mark.parametrize("text", ODD)
def test_round_trip_is_exact_with_byte_fallback(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert UNK_ID not in ids  # unseen characters become bytes, never <unk>


def test_round_trip_and_fast_encoding_on_corpus_text(tok, make_docs):
    sp = spm.SentencePieceProcessor(model_file=str(tok.path))
    for text in make_docs(20, seed=9):
        assert tok.decode(tok.encode(text)) == text and tok.encode(text) == sp.encode(text)


@pytest.mark.parametrize("text", ODD)
def test_fast_line_encoding_equals_sentencepiece_whole_text(tok, text):
    sp = spm.SentencePieceProcessor(model_file=str(tok.path))
    assert tok.encode(text) == sp.encode(text)


def test_encode_documents_puts_eos_after_each(tok):
    a, b = tok.encode("first doc"), tok.encode("second\ndoc")
    stream = tok.encode_documents(["first doc", "second\ndoc"])
    assert stream.tolist() == a + [EOS_ID] + b + [EOS_ID]
    assert stream.dtype == np.uint16


def test_pickles_by_path(tok):
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.fingerprint == tok.fingerprint and clone.encode("abc") == tok.encode("abc")
    assert len(pickle.dumps(tok)) < 1000


def test_trained_once_then_cached_by_fingerprint(cfg):
    source = open_source(cfg.dataset, None, cfg.cache_path)
    first = open_tokenizer(cfg, source)
    mtime = first.path.stat().st_mtime_ns
    again = open_tokenizer(cfg, source)
    assert again.path == first.path and again.path.stat().st_mtime_ns == mtime
    other = open_tokenizer(cfg.replace(tokenizer=cfg.tokenizer.replace(vocab_size=420)), source)
    assert other.path != first.path and other.vocab_size == 420
    unigram = open_tokenizer(cfg.replace(tokenizer=cfg.tokenizer.replace(type="unigram")), source)
    assert unigram.path not in (first.path, other.path)


def test_given_model_is_used_as_is(cfg, tok):
    source = open_source(cfg.dataset, None, cfg.cache_path)
    given = open_tokenizer(cfg.replace(tokenizer=cfg.tokenizer.replace(path=str(tok.path))), source)
    assert given.fingerprint == tok.fingerprint
    assert not (cfg.cache_path / "tokenizers").exists()  # nothing trained


def test_bad_tokenizer_inputs(tmp_path):
    with pytest.raises(DataError, match=r"does not exist; fix DataConfig\.tokenizer\.path"):
        Tokenizer(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(DataError,
                       match=r"not a sentencepiece model; fix DataConfig\.tokenizer\.path"):
        Tokenizer(tmp_path / "junk.model")
    with pytest.raises(DataError, match="no text to train the tokenizer"):
        train(["", "  "], tmp_path / "t.model", vocab_size=300)


def test_vocab_size_hint_follows_sentencepiece_complaint(tmp_path, make_docs):
    """Too high for the text: lower it; too small for the characters: raise it. Either
    way the hint names the field, DataConfig.tokenizer.vocab_size (the runner shows it
    as the job's data.tokenizer.vocab_size)."""
    docs = make_docs(40, seed=2)
    with pytest.raises(DataError, match=r"Vocabulary size too high, at most \d+\); lower "
                       r"DataConfig\.tokenizer\.vocab_size or give more text$"):
        train(docs, tmp_path / "t.model", vocab_size=5000)
    with pytest.raises(DataError, match=r"Vocabulary size too small\); raise "
                       r"DataConfig\.tokenizer\.vocab_size to at least \d+$") as err:
        train(docs, tmp_path / "t.model", vocab_size=100)
    assert "lower" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize("config, field, value, problem", [
    ("TokenizerConfig", "vocab_size", 2, "must be >= 8"),
    ("TokenizerConfig", "type", "wordpiece", "must be one of bpe, unigram"),
    ("TokenizerConfig", "sample_chars", 10, "must be >= 1000"),
    ("DataConfig", "num_proc", 0, "must be >= 1"),
    ("DataConfig", "shard_tokens", 1, "must be >= 2"),
    ("DataConfig", "mode", "online", "must be one of pretokenized, streaming, download")])
def test_config_errors_name_the_field(config, field, value, problem):
    import ten.data

    with pytest.raises(DataError) as err:
        getattr(ten.data, config)(**{field: value})
    assert str(err.value) == f"{config}.{field}: {problem}, got {value!r}"


def test_external_model_with_default_settings(tmp_path, make_docs):
    """A model trained elsewhere (dummy prefix, normalisation): exact via the slow path."""
    import io

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(make_docs(100, seed=4)),
                                   model_writer=buf, vocab_size=200, minloglevel=2)
    (tmp_path / "ext.model").write_bytes(buf.getvalue())
    tok = Tokenizer(tmp_path / "ext.model")
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "ext.model"))
    assert tok.pad_id == tok.eos_id == sp.eos_id()  # no pad piece: EOS stands in
    texts = ["two\nlines here", "another one"]
    assert [tok.encode(t) for t in texts] == [sp.encode(t) for t in texts]
    assert tok.encode_documents(texts).tolist() == \
        sp.encode(texts[0]) + [tok.eos_id] + sp.encode(texts[1]) + [tok.eos_id]
