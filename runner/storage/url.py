"""A store's address, parsed once: :class:`StoreURL`.

``storage.url`` (and a command's store argument) is ``./runs``, ``/abs/path``,
``~/runs``, ``file:///abs/path`` (a local folder) or ``s3://bucket/prefix``. The job's
validator, :func:`runner.storage.open_store`, the run directory's place and the folder
name a bucket's working copy gets all read the one parse, so none of them splits the
text again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from runner.storage.base import check_prefix

SCHEMES = "use a local path, file:// or s3://"


class StoreURLError(ValueError):
    """A store URL that names no store: ``problem`` (a predicate: "is empty", "needs a
    bucket: ...") and the ``hint`` that fixes it."""

    def __init__(self, problem: str, hint: str = "") -> None:
        self.problem, self.hint = problem, hint
        super().__init__(f"{problem}; {hint}" if hint else problem)


@dataclass(frozen=True)
class StoreURL:
    """``text`` as given; a bucket store's ``bucket`` and ``prefix`` (no slashes at its
    ends), or a local store's ``path`` (``file://`` stripped, ``~`` expanded)."""

    text: str
    bucket: str | None = None
    prefix: str = ""
    path: Path | None = None

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        """The address ``url`` names. StoreURLError (a ValueError) in one line naming the
        fix, never echoing the URL (credentials put in one must not reach a log)."""
        if not isinstance(url, str) or not url.strip():
            raise StoreURLError("is empty", SCHEMES)
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower() if sep else ""
        if scheme == "s3":
            bucket, _, prefix = rest.partition("/")
            if not bucket or "@" in bucket or ":" in bucket:
                raise StoreURLError("needs a bucket: s3://bucket/prefix",
                                    "credentials go in the environment, never in the URL")
            try:
                return cls(url, bucket=bucket, prefix=check_prefix(prefix))
            except ValueError as e:
                raise StoreURLError(str(e)) from None
        if scheme == "file":
            path = rest[len("localhost"):] if rest.startswith("localhost/") else rest
            if not path.startswith("/"):
                raise StoreURLError("is a file:// URL without an absolute path",
                                    "write file:///abs/path")
            return cls(url, path=Path(path))
        if scheme:
            raise StoreURLError(f"unsupported scheme {scheme + '://'!r}", SCHEMES)
        return cls(url, path=Path(url).expanduser())

    @property
    def is_remote(self) -> bool:
        return self.bucket is not None

    def key(self, endpoint_url: str | None = None) -> str:
        """A folder name for this store: its address made path-safe (readable), and a
        digest of the URL and endpoint (distinct however the readable part collides or
        is cut): where a bucket's runs keep their working copies on a machine."""
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", self.text.split("://", 1)[-1])
        readable = readable.strip("_.")[:80]
        digest = hashlib.sha256(f"{endpoint_url or ''}\n{self.text}".encode()).hexdigest()[:8]
        return f"{readable or 'store'}-{digest}"
