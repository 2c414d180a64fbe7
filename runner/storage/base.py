"""The storage interface: a flat key -> bytes store with '/'-separated string keys.

Two implementations (:mod:`runner.storage.local`, :mod:`runner.storage.s3`) provide the
same small set of operations; everything above them (checkpoints, leases, the dataset
cache) is written against :class:`Store` only, and tested against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.errors import UserError
from runner.exit_codes import ExitCode
from ten.fileio import sha256_file

__all__ = ["COMMAND_SETTINGS", "JOB_SETTINGS", "ObjectInfo", "SettingNames", "StorageError",
           "Store", "check_key", "check_prefix", "sha256_file"]


@dataclass(frozen=True)
class SettingNames:
    """What a storage error tells the user to fix, by the name they set it under: a
    job's keys (a run), or a command's flag and the environment (a command that reads a
    run from the command line: ``ten-runner logs s3://... --endpoint-url ...``)."""

    url: str
    endpoint_url: str
    region: str


JOB_SETTINGS = SettingNames("storage.url", "storage.endpoint_url", "storage.region")
COMMAND_SETTINGS = SettingNames("the URL", "--endpoint-url", "AWS_REGION")


class StorageError(UserError):
    """The store cannot be read or written: a one-line message naming the fix.

    Never contains credentials. The CLI prints it without a traceback and exits with
    ``ExitCode.STORAGE``.
    """

    def __init__(self, message: str, exit_code: int = ExitCode.STORAGE):
        super().__init__(" ".join(str(message).split()), exit_code)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str | None = None  # without quotes; None where the store has none (local)


def check_key(key: str) -> str:
    """Keys are relative '/'-separated paths: no empty, '.' or '..' segments."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key:
        raise ValueError(f"invalid storage key {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid storage key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A bucket prefix without its one optional trailing '/': ``runs/`` -> ``runs``.

    Raises ValueError when a segment is empty (``a//b``, a leading '/'), ``.`` or ``..``:
    S3 keeps such keys literally, but S3-compatible servers and the tools that mirror a
    bucket to disk (``aws s3 sync``, rclone) normalise them, so ``s3://b/../../etc`` could
    read or write outside the intended prefix. The message names the segment, never the
    whole value (it may hold a resolved ${VAR})."""
    if not prefix:
        return ""
    body = prefix[:-1] if prefix.endswith("/") else prefix
    for part in body.split("/"):
        if part in ("", ".", ".."):
            what = "an empty segment ('//')" if not part else f"a {part!r} segment"
            raise ValueError(f"the s3 prefix has {what}; write s3://bucket/a/b with plain "
                             "names between the slashes")
    return body


class Store:
    """What every store provides. Keys are relative to the store's root/prefix."""

    url: str  # for messages; never contains credentials
    conditional_writes: bool  # put_bytes(if_absent=True) is atomic on this store

    def put_file(self, key: str, local_path: Path, sha256: str | None = None) -> ObjectInfo:
        """Upload a file and verify the stored object (size, and content where the store
        allows: see the implementations); ``sha256`` (the expected digest of the local
        file) is checked before uploading and used when the store's ETag cannot be."""
        raise NotImplementedError

    def get_file(self, key: str, local_path: Path) -> None:
        """Download to ``local_path`` atomically (temporary file + rename)."""
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        """Write a small object. With ``if_absent`` return False (and write nothing) when
        the key exists: atomic where :attr:`conditional_writes`, check-then-put otherwise."""
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes | None:
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix`` (a plain string prefix, as in S3), sorted."""
        raise NotImplementedError

    def delete(self, keys: list[str] | tuple[str, ...]) -> None:
        """Delete keys; missing keys are not an error."""
        raise NotImplementedError

    def delete_folder(self, prefix: str) -> None:
        """Delete everything under ``prefix`` ("" or ending in "/": a folder of keys)."""
        if keys := self.list(prefix):
            self.delete(keys)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
