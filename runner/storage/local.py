"""A store over a local directory (a laptop run, a mounted volume, the tests).

Every write goes to a hidden temporary file in the target's folder, is fsynced and
then renamed into place, so a reader never sees half an object. ``if_absent`` links
the finished temporary file to its final name (``os.link`` fails if the name exists),
which is atomic on POSIX file systems.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from runner.storage.base import ObjectInfo, StorageError, Store, check_key, sha256_file
from ten.fileio import fsync_dir

REMOVE_ATTEMPTS = 5  # passes over a folder that gains files while it is removed

_TMP = ".tmp-"  # temporary files start with this; never listed


def _tmp_name(final: Path) -> Path:
    return final.with_name(f"{_TMP}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


class LocalStore(Store):
    conditional_writes = True

    def __init__(self, root: Path, url: str | None = None, create: bool = True):
        """A store in ``root``, made when missing unless ``create`` is false (a reader's:
        a missing folder reads as empty, and a write makes it)."""
        self.root = Path(root).expanduser().absolute()
        self.url = url or f"file://{self.root}"
        if not create:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create storage directory {self.root}: "
                               f"{e.strerror or e}; check storage.url") from None

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _fail(self, what: str, key: str, e: OSError) -> StorageError:
        return StorageError(f"cannot {what} {self.root / key}: {e.strerror or e}")

    def _write_tmp(self, final: Path, write) -> Path:
        tmp = _tmp_name(final)
        for attempt in range(3):
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:  # a concurrent delete() removed the empty folder
                if attempt == 2:
                    raise
                continue
            with f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            return tmp
        raise AssertionError("unreachable")

    def put_file(self, key: str, local_path: Path, sha256: str | None = None) -> ObjectInfo:
        final = self._path(key)
        try:
            if sha256 is not None and sha256_file(Path(local_path)) != sha256:
                raise StorageError(f"local file {local_path} does not match its expected "
                                   "sha256 (changed or corrupt); not uploading it")
            with open(local_path, "rb") as src:
                tmp = self._write_tmp(final, lambda f: shutil.copyfileobj(src, f, 1 << 20))
            os.replace(tmp, final)
            fsync_dir(final.parent, strict=False)
            size, expected = final.stat().st_size, Path(local_path).stat().st_size
        except OSError as e:
            raise self._fail("write", key, e) from None
        if size != expected:
            raise StorageError(f"{self.root / key}: stored {size} bytes, expected {expected}")
        return ObjectInfo(size)

    def get_file(self, key: str, local_path: Path) -> None:
        src = self._path(key)
        local_path = Path(local_path)
        try:
            with open(src, "rb") as s:
                tmp = self._write_tmp(local_path, lambda f: shutil.copyfileobj(s, f, 1 << 20))
            os.replace(tmp, local_path)
        except FileNotFoundError:
            raise StorageError(f"{self.url}/{key} does not exist") from None
        except OSError as e:
            raise self._fail("read", key, e) from None

    def put_bytes(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        final = self._path(key)
        try:
            tmp = self._write_tmp(final, lambda f: f.write(data))
            if not if_absent:
                os.replace(tmp, final)
            else:
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink(missing_ok=True)
            fsync_dir(final.parent, strict=False)
        except OSError as e:
            raise self._fail("write", key, e) from None
        return True

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._fail("read", key, e) from None

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            if not path.is_file():
                return None
            return ObjectInfo(path.stat().st_size)
        except OSError as e:
            raise self._fail("read", key, e) from None

    def list(self, prefix: str = "") -> list[str]:
        # Walk the deepest folder the prefix names completely, filter by string prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        keys = []
        try:
            for dirpath, _dirs, files in os.walk(top):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    if name.startswith(_TMP):
                        continue
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as e:
            raise self._fail("list", prefix, e) from None
        return sorted(keys)

    def delete(self, keys) -> None:
        for key in keys:
            path = self._path(key)
            try:
                path.unlink(missing_ok=True)
            except IsADirectoryError:
                continue
            except OSError as e:
                raise self._fail("delete", key, e) from None
            # Remove folders left empty, up to the root (a best effort: another writer
            # may be filling one right now, in which case rmdir fails and that is fine).
            parent = path.parent
            while parent != self.root and self.root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    def delete_folder(self, prefix: str) -> None:
        """The folder itself goes, with what no key names (temporary files). A file that
        appears while it goes (``rm --force`` of a run still writing its last lines) is
        removed by going over the folder again, a few times, not reported as a failure."""
        folder = self.root / check_key(prefix.rstrip("/")) if prefix else self.root
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                shutil.rmtree(folder)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.ENOTEMPTY or attempt == REMOVE_ATTEMPTS - 1:
                    raise self._fail("delete", prefix, e) from None
