"""A cached tokenizer counts only with its checksum: a corrupt or unfinished one is
trained again (one log line), never used, also when it came from a shared cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ten.data import open_data


def checksum_path(model: Path) -> Path:
    return model.with_name("tokenizer.model.sha256")


def _train_tokens(data):
    return data.train.read(0, len(data.train)).tolist()


def test_flipped_bytes_anywhere_are_detected_and_remade(cfg, capsys):
    clean = open_data(cfg)
    model, good, tokens = clean.tokenizer.path, clean.tokenizer.path.read_bytes(), \
        _train_tokens(clean)
    capsys.readouterr()
    for offset in (5, len(good) // 3, 2 * len(good) // 3, len(good) - 3):
        bad = bytearray(good)
        bad[offset] ^= 0x01
        model.write_bytes(bytes(bad))
        again = open_data(cfg)
        err = capsys.readouterr().err
        assert err.count("fails its sha256 check (corrupt); training it again") == 1, offset
        assert model.read_bytes() == good
        assert again.tokenizer.fingerprint == clean.tokenizer.fingerprint
        assert again.fingerprint == clean.fingerprint and _train_tokens(again) == tokens


def test_a_model_without_its_checksum_is_unfinished(cfg, capsys):
    model = open_data(cfg).tokenizer.path
    good = model.read_bytes()
    checksum_path(model).unlink()  # as if the process died between the two writes
    model.write_bytes(good[: len(good) // 2])
    assert open_data(cfg).tokenizer.path.read_bytes() == good
    assert "has no checksum (never finished); training it again" in capsys.readouterr().err
    assert checksum_path(model).read_text().split()[1] == "tokenizer.model"


class DirCache:
    """A PreparedCache over a local folder (the bucket's semantics, without the bucket)."""

    def __init__(self, root: Path) -> None:
        self.root, self.fetched, self.published = root, [], []

    def fetch(self, key: str, directory: Path) -> bool:
        if not (self.root / key).is_dir():
            return False
        shutil.copytree(self.root / key, directory, dirs_exist_ok=True)
        self.fetched.append(key)
        return True

    def publish(self, key: str, directory: Path) -> None:
        if not (self.root / key).exists():
            shutil.copytree(directory, self.root / key, ignore=shutil.ignore_patterns(".*"))
            self.published.append(key)


def test_a_corrupt_shared_copy_is_not_used(cfg, tmp_path, capsys):
    """A copy uploaded with a corrupt model (and the checksum it was trained with)."""
    shared = DirCache(tmp_path / "shared")
    first = open_data(cfg, cache=shared)
    assert sorted(k.split("-")[0] for k in shared.published) == ["shards", "tokenizer"]
    key = next(k for k in shared.published if k.startswith("tokenizer-"))
    good = first.tokenizer.path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x04
    (shared.root / key / "tokenizer.model").write_bytes(bytes(bad))
    capsys.readouterr()
    other = open_data(cfg.replace(cache_dir=str(tmp_path / "machine2")), cache=shared)
    err = capsys.readouterr().err
    assert f"the tokenizer fetched for {key} fails its sha256 check" in err
    assert other.tokenizer.path.read_bytes() == good  # trained here instead
    assert other.fingerprint == first.fingerprint


@pytest.mark.parametrize("fresh_here", [True, False])
def test_published_when_the_cache_lacks_it(cfg, tmp_path, fresh_here):
    """Prepared before there was a shared cache (or just now): published all the same;
    fetched: nothing to publish."""
    if not fresh_here:
        open_data(cfg)  # an earlier run, no shared cache
    shared = DirCache(tmp_path / "shared")
    one = open_data(cfg, cache=shared)
    assert len(shared.published) == 2 and shared.fetched == []
    two = DirCache(shared.root)
    again = open_data(cfg.replace(cache_dir=str(tmp_path / "machine2")), cache=two)
    assert two.published == [] and len(two.fetched) == 2
    assert _train_tokens(again) == _train_tokens(one)
