"""Local checkpoints: malformed manifests are corrupt (never a crash), files that are
not plain tensors are refused without being unpickled, a re-save never removes the
committed folder before its replacement is in place, start-up cleanup repairs every
crash point, and a full disk is one line."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from ten.train import checkpoint as ckpt


def make(root: Path, step: int, **extra: object) -> Path:
    return ckpt.save(root, step, {"model.pt": {"w": torch.full((4,), float(step))},
                                  "config.json": b'{"d": 32}', **extra})


def rewrite_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(edit(manifest)))


def reseal(path: Path) -> None:
    """Recompute every sha256 and size in the manifest, as someone who can write the
    folder (or the bucket) would after changing a file."""
    def edit(m):
        for name in m["files"]:
            data = (path / name).read_bytes()
            m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return m
    rewrite_manifest(path, edit)


def _rename_files(m):
    m["entries"] = m.pop("files")
    return m


def _set(key, value):
    def edit(m):
        m[key] = value
        return m
    return edit


def _entry(name, value):
    def edit(m):
        m["files"][name] = value
        return m
    return edit


MALFORMED = {
    "files renamed": lambda p: rewrite_manifest(p, _rename_files),
    "files a list": lambda p: rewrite_manifest(p, _set("files", ["model.pt"])),
    "entry a string": lambda p: rewrite_manifest(p, _entry("model.pt", "abc")),
    "size a string": lambda p: rewrite_manifest(
        p, _entry("model.pt", {"size": "10", "sha256": "0" * 64})),
    "size a bool": lambda p: rewrite_manifest(
        p, _entry("model.pt", {"size": True, "sha256": "0" * 64})),
    "sha256 an int": lambda p: rewrite_manifest(p, _entry("model.pt", {"size": 1, "sha256": 7})),
    "no sha256": lambda p: rewrite_manifest(p, _entry("model.pt", {"size": 1})),
    "step a string": lambda p: rewrite_manifest(p, _set("step", "8")),
    "another step": lambda p: rewrite_manifest(p, _set("step", 4)),
    "format missing": lambda p: rewrite_manifest(p, lambda m: {k: v for k, v in m.items()
                                                               if k != "format"}),
    "path in a name": lambda p: rewrite_manifest(
        p, _entry("../../etc/passwd", {"size": 1, "sha256": "0" * 64})),
    "names the manifest": lambda p: rewrite_manifest(
        p, _entry("manifest.json", {"size": 1, "sha256": "0" * 64})),
    "bad JSON": lambda p: (p / "manifest.json").write_text('{"format": 1, "files": {'),
    "not UTF-8": lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe{}"),
    "a JSON list": lambda p: (p / "manifest.json").write_text("[1, 2]"),
    "a JSON string": lambda p: (p / "manifest.json").write_text('"files"'),
    "deeply nested": lambda p: (p / "manifest.json").write_text("[" * 100000 + "]" * 100000),
    "empty": lambda p: (p / "manifest.json").write_text(""),
}


@pytest.mark.parametrize("damage", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_manifest_is_corrupt_and_the_previous_step_is_used(tmp_path, damage):
    root = tmp_path / "checkpoints"
    make(root, 4)
    damage(make(root, 8))
    lines = []
    found = ckpt.latest_valid(root, lines.append)
    assert found is not None and found.step == 4
    assert len(lines) == 1 and "step-00000008" in lines[0] and "\n" not in lines[0]
    assert lines[0].startswith("skipping corrupt checkpoint:")


@pytest.mark.parametrize("manifest,problem", [
    ({"format": 1, "step": 3, "files": {}}, None),
    ({"format": 1, "step": 3, "files": {"a.pt": {"size": 0, "sha256": "a" * 64}}}, None),
    ([], "is a JSON list, not an object"),
    ({"format": 2, "step": 3, "files": {}}, "has format 2, expected 1"),
    ({"format": True, "step": 3, "files": {}}, "has format True, expected 1"),
    ({"format": 1, "step": -1, "files": {}}, "has no valid step (-1)"),
    ({"format": 1, "step": 3}, 'has no "files" object'),
    ({"format": 1, "step": 3, "files": {"a": {"size": -1, "sha256": "a" * 64}}},
     "has a malformed entry for a (needs size and sha256)"),
    ({"format": 1, "step": 3, "files": {"a": {"size": 1, "sha256": "A" * 64}}},
     "has a malformed entry for a (needs size and sha256)"),
    ({"format": 1, "step": 3, "files": {".hidden": {"size": 1, "sha256": "a" * 64}}},
     "lists a bad file name '.hidden'"),
    ({"format": 1, "step": 3, "files": {"a/b": {"size": 1, "sha256": "a" * 64}}},
     "lists a bad file name 'a/b'"),
])
def test_manifest_problem_table(manifest, problem):
    assert ckpt.manifest_problem(manifest) == problem


def test_manifest_must_match_its_folder_step():
    assert ckpt.manifest_problem({"format": 1, "step": 3, "files": {}}, 4) == \
        "is for step 3, not 4"


class Marker:
    """A pickle that creates a file when unpickled: what an attacker would plant."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_file_that_is_not_plain_tensors_is_refused_never_unpickled(tmp_path):
    root, marker = tmp_path / "checkpoints", tmp_path / "pwned"
    path = make(root, 8)
    torch.save({"w": torch.zeros(4), "x": Marker(marker)}, path / "model.pt")
    reseal(path)  # the sha256 now matches: the manifest proves nothing
    assert ckpt.verify(path)["step"] == 8
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load(path, "model.pt")
    message = str(e.value)
    assert "model.pt refuses to load: not plain tensors (possibly tampered)" in message
    assert "\n" not in message and "step-00000008" in message
    assert not marker.exists()
    # torch's own check still refuses a raw pickle (not a torch zip)
    (path / "model.pt").write_bytes(pickle.dumps(Marker(marker)))
    with pytest.raises(ckpt.CheckpointError, match="refuses to load"):
        ckpt.load(path, "model.pt")
    assert not marker.exists()


def test_a_truncated_file_is_one_line(tmp_path):
    path = make(tmp_path, 1)
    (path / "model.pt").write_bytes((path / "model.pt").read_bytes()[:50])
    with pytest.raises(ckpt.CheckpointError, match="cannot load model.pt") as e:
        ckpt.load(path, "model.pt")
    assert "\n" not in str(e.value)


# --- re-saving a step, and every crash point of it -------------------------------------

def folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def weights(path: Path) -> float:
    return float(ckpt.load(path, "model.pt")["w"][0])


def test_resave_moves_the_committed_folder_aside_until_the_new_one_is_in_place(
        tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    ckpt.save(root, 8, {"model.pt": {"w": torch.zeros(4)}})
    seen = []
    real_replace = os.replace

    def watch(src, dst):
        if Path(src).name.startswith(".tmp-") and Path(dst).name == "step-00000008":
            # the moment the new folder goes in: the old one is whole, under another name
            olds = [p for p in root.iterdir() if p.name.startswith(".old-")]
            seen.append([ckpt.verify(p, 8)["step"] for p in olds])
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", watch)
    ckpt.save(root, 8, {"model.pt": {"w": torch.ones(4)}})
    assert seen == [[8]]
    assert folders(root) == ["step-00000008"]
    assert weights(root / "step-00000008") == 1.0


def crash_state(root: Path, *, final: str | None, tmp: str | None, old: str | None) -> None:
    """Lay out the folders a crash would leave. Each of final/tmp/old is None (absent),
    "complete" (a verifying checkpoint) or "partial" (no manifest)."""
    for name, kind, value in (("step-00000008", final, 1.0),
                              (".tmp-step-00000008-4242", tmp, 2.0),
                              (".old-step-00000008-4242", old, 3.0)):
        if kind is None:
            continue
        scratch = root.parent / "scratch"
        made = ckpt.save(scratch, 8, {"model.pt": {"w": torch.full((4,), value)}})
        if kind == "partial":
            (made / "manifest.json").unlink()
        os.replace(made, root / name)


@pytest.mark.parametrize("final,tmp,old,expect,restored", [
    # crashed while writing the new folder: the committed one is untouched
    ("complete", "partial", None, 1.0, False),
    # crashed after moving the committed one aside, before the new one was complete
    (None, "partial", "complete", 3.0, True),
    # crashed between the two renames: both complete, the new one wins
    (None, "complete", "complete", 2.0, True),
    # crashed after the manifest, before the rename (first save of the step)
    (None, "complete", None, 2.0, True),
    # crashed after the new one went in, while deleting the aside one
    ("complete", None, "complete", 1.0, False),
    ("complete", None, "partial", 1.0, False),
    # nothing complete anywhere: nothing to restore, everything uncommitted removed
    (None, "partial", "partial", None, False),
])
def test_cleanup_repairs_every_crash_point_of_a_save(tmp_path, final, tmp, old, expect,
                                                     restored):
    root = tmp_path / "checkpoints"
    ckpt.save(root, 4, {"model.pt": {"w": torch.full((4,), 0.5)}})
    crash_state(root, final=final, tmp=tmp, old=old)
    lines = []
    ckpt.cleanup(root, lines.append)
    found = ckpt.latest_valid(root, lines.append)
    if expect is None:
        assert folders(root) == ["step-00000004"] and found.step == 4
    else:
        assert folders(root) == ["step-00000004", "step-00000008"]
        assert found.step == 8 and weights(found.path) == expect
    assert any("restoring checkpoint step-00000008" in line for line in lines) == restored
    assert all("\n" not in line for line in lines)


def test_cleanup_removes_a_temp_folder_that_fails_its_checksums(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    crash_state(root, final=None, tmp="complete", old=None)
    tmp = root / ".tmp-step-00000008-4242"
    data = bytearray((tmp / "model.pt").read_bytes())
    data[-30] ^= 0xFF
    (tmp / "model.pt").write_bytes(bytes(data))
    ckpt.cleanup(root, lambda s: None)
    assert folders(root) == []


# --- a full disk ---------------------------------------------------------------------

def test_a_full_disk_is_one_line_and_earlier_checkpoints_stay(small_disk):
    root = small_disk(256) / "checkpoints"
    ckpt.save(root, 4, {"model.pt": {"w": torch.arange(64.0)}, "config.json": b"{}"})
    with pytest.raises(ckpt.CheckpointWriteError) as e:
        ckpt.save(root, 8, {"model.pt": {"w": torch.zeros(200_000)}, "config.json": b"{}"})
    message = str(e.value)
    assert "\n" not in message
    assert "No space left on device" in message and "step-00000008" in message
    assert "free on" in message
    assert folders(root) == ["step-00000004"]  # no temporary folder left behind
    found = ckpt.latest_valid(root)
    assert found.step == 4
    assert torch.equal(ckpt.load(found.path, "model.pt")["w"], torch.arange(64.0))


def test_a_full_disk_while_resaving_keeps_the_committed_step(small_disk):
    root = small_disk(256) / "checkpoints"
    ckpt.save(root, 8, {"model.pt": {"w": torch.arange(64.0)}})
    with pytest.raises(ckpt.CheckpointWriteError):
        ckpt.save(root, 8, {"model.pt": {"w": torch.zeros(200_000)}})
    assert folders(root) == ["step-00000008"]
    assert torch.equal(ckpt.load(ckpt.latest_valid(root).path, "model.pt")["w"],
                       torch.arange(64.0))


def test_the_format_helpers_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, ten.train.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
