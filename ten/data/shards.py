"""Token shards on disk: a small header, raw little-endian ids, and a manifest written last.

A shard file is::

    offset 0   8 bytes   magic b"TENTOKS\\0"
    offset 8   uint32    format version (1)
    offset 12  uint32    bytes per token: 2 (uint16, vocab <= 65536) or 4 (uint32)
    offset 16  uint64    number of tokens in this file
    offset 64  tokens    (the header is padded to 64 bytes so uint32 data stays aligned)

A split (train, val) is one token stream cut into shards of ``shard_tokens``: the cut
ignores document boundaries, so a document longer than a shard simply continues in the
next file. ``manifest.json`` (fingerprints, seq_len, counts, per-shard sha256) is
written last, atomically: a directory without one is unfinished and is never read.

The writer is append-only and resumable: after each batch of documents it fsyncs the
open shard and records how many tokens are committed (``progress.json``); a restart
truncates anything past that point and continues, so nothing is duplicated or lost.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ten.data.errors import DataError
from ten.fileio import atomic_write, sha256_file

MAGIC = b"TENTOKS\0"
VERSION = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQ")
MANIFEST = "manifest.json"
PROGRESS = "progress.json"


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (``ten.fileio.atomic_write``: a hidden temp file, so a folder
    being published never carries one, removed if the write fails on a full disk)."""
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True).encode())


def _header(itemsize: int, tokens: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, itemsize, tokens).ljust(HEADER_BYTES, b"\0")


def read_header(path: Path) -> tuple[int, int]:
    """(bytes per token, token count) of a shard; DataError if it is not one."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ValueError("shorter than its header")
    magic, version, itemsize, tokens = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError("bad magic (not a ten token shard)")
    if version != VERSION:
        raise ValueError(f"format version {version}, this code reads {VERSION}")
    if itemsize not in (2, 4):
        raise ValueError(f"bad token size {itemsize}")
    return itemsize, tokens


class SplitWriter:
    """Appends one split's token stream to numbered shard files; resumable."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int,
                 state: dict[str, Any] | None = None) -> None:
        self.dir, self.split, self.dtype = directory, split, np.dtype(dtype)
        self.shard_tokens = shard_tokens
        state = state or {"shards": [], "open_tokens": 0}
        self.shards: list[dict[str, Any]] = list(state["shards"])
        self.open_tokens = int(state["open_tokens"])
        # Drop whatever an interrupted run wrote past the committed state.
        for path in self.dir.glob(f"{split}-*.bin"):
            if int(path.stem.split("-")[1]) > len(self.shards):
                path.unlink()
        path = self._path(len(self.shards))
        if self.open_tokens and not path.exists():
            raise DataError(f"{path} is missing but progress.json counts {self.open_tokens} "
                            f"tokens in it; delete {self.dir} and prepare again")
        self._file = open(path, "r+b" if path.exists() else "w+b")
        self._file.truncate(HEADER_BYTES + self.open_tokens * self.dtype.itemsize)
        self._file.seek(0)
        self._file.write(_header(self.dtype.itemsize, 0))  # 0 = still open
        self._file.seek(0, os.SEEK_END)

    def _path(self, index: int) -> Path:
        return self.dir / f"{self.split}-{index:06d}.bin"

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self.open_tokens

    def append(self, tokens: np.ndarray) -> None:
        tokens = tokens.astype(self.dtype.newbyteorder("<"), copy=False)
        while len(tokens):
            take = min(len(tokens), self.shard_tokens - self.open_tokens)
            self._file.write(tokens[:take].tobytes())
            self.open_tokens += take
            tokens = tokens[take:]
            if self.open_tokens == self.shard_tokens:
                self._close_shard()
                self._file = open(self._path(len(self.shards)), "w+b")
                self._file.write(_header(self.dtype.itemsize, 0))

    def _close_shard(self) -> None:
        self._file.seek(0)
        self._file.write(_header(self.dtype.itemsize, self.open_tokens))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        path = self._path(len(self.shards))
        self.shards.append({"file": path.name, "tokens": self.open_tokens,
                            "bytes": path.stat().st_size,
                            "sha256": sha256_file(path)})
        self.open_tokens = 0

    def sync(self) -> dict[str, Any]:
        """Make everything appended so far durable; returns the state to resume from."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return {"shards": list(self.shards), "open_tokens": self.open_tokens}

    def close(self) -> None:
        """Close the open shard as it is, after a failure: the committed state (the last
        ``sync``) is what a restart resumes from, and it truncates the rest."""
        try:
            self._file.close()
        except OSError:  # flushing the buffer onto a full disk: that tail is dropped anyway
            pass

    def finish(self) -> list[dict[str, Any]]:
        """Close the last shard (dropped if empty); returns every shard's manifest entry."""
        if self.open_tokens:
            self._close_shard()
        else:
            self._file.close()
            self._path(len(self.shards)).unlink()
        return self.shards


class TokenStream:
    """One split's shards as a single random-access token array (memory-mapped).

    Memory maps are opened lazily, so the object pickles cheaply into DataLoader workers.
    """

    def __init__(self, directory: Path, shards: list[dict[str, Any]], dtype: str) -> None:
        self.dir, self.shards, self.dtype = directory, shards, np.dtype(dtype).newbyteorder("<")
        self.starts = np.cumsum([0] + [s["tokens"] for s in shards])  # (n_shards + 1,)
        self._maps: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}

    def _open(self) -> list[np.ndarray]:
        if self._maps is None:
            try:
                self._maps = [np.memmap(self.dir / s["file"], dtype=self.dtype, mode="r",
                                        offset=HEADER_BYTES, shape=(s["tokens"],))
                              for s in self.shards]
            except FileNotFoundError as e:  # verified at the start: removed since
                raise DataError(f"{e.filename} vanished during the run (was the data cache "
                                "cleared?); run the job again: it prepares the data anew "
                                "and resumes") from None
        return self._maps

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as a fresh array, across shard boundaries."""
        maps = self._open()
        out = np.empty(length, dtype=self.dtype)
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        done = 0
        while done < length:
            lo = start + done - int(self.starts[i])
            take = min(length - done, len(maps[i]) - lo)
            out[done:done + take] = maps[i][lo:lo + take]
            done += take
            i += 1
        return out


def verify(directory: Path, expected: dict[str, Any], command: str,
           checksums: bool = True) -> dict[str, Any]:
    """Load the manifest and check it and every shard against what the job expects.

    ``expected`` maps manifest keys (dotted for nested ones) to required values; any
    difference, missing/short/altered shard raises a DataError naming ``command``.
    """
    hint = f"re-run: {command}"
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{directory} has no {MANIFEST} (never finished preparing); "
                        f"{hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(f"{path} is corrupt; {hint}") from None
    if manifest.get("version") != VERSION:
        raise DataError(f"{path} has format version {manifest.get('version')}, this code "
                        f"reads {VERSION}; {hint}")
    for key, want in expected.items():
        have: Any = manifest
        for part in key.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if have != want:
            raise DataError(f"{path} is stale: {key} is {have!r}, this job needs {want!r}; "
                            f"{hint}")
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            _verify_shard(directory / shard["file"], shard, itemsize, checksums, hint)
    return manifest


def _verify_shard(file: Path, shard: dict[str, Any], itemsize: int, checksums: bool,
                  hint: str) -> None:
    """One shard against its manifest entry: there, its size, its header, its sha256."""
    if not file.exists():
        raise DataError(f"shard {file} is missing; {hint}")
    size = file.stat().st_size
    if size != HEADER_BYTES + shard["tokens"] * itemsize:
        raise DataError(f"shard {file} is {size} bytes, the manifest says "
                        f"{HEADER_BYTES + shard['tokens'] * itemsize} (truncated?); {hint}")
    try:
        head_itemsize, head_tokens = read_header(file)
    except ValueError as e:
        raise DataError(f"shard {file} has a bad header ({e}); {hint}") from None
    if (head_itemsize, head_tokens) != (itemsize, shard["tokens"]):
        raise DataError(f"shard {file} header does not match the manifest; {hint}")
    if checksums and sha256_file(file) != shard["sha256"]:
        raise DataError(f"shard {file} fails its sha256 check (corrupt); {hint}")
