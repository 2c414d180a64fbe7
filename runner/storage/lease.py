"""One writer per job: a run-epoch lease in the store.

Every writer start claims ``<job>/lease/epoch-NNNNNNNN`` (max existing + 1) with a
conditional put (If-None-Match: * on S3, a hard link locally), so two starts can never
claim the same epoch. :meth:`Lease.check` (before every commit) raises
:class:`LeaseLost` as soon as a newer epoch exists: the older writer — say a zombie spot
instance still running after its job was relaunched elsewhere — stops before it writes
a manifest or moves ``LATEST``.

On stores that ignore conditional writes (rclone) the claim is check-then-put followed
by a read-back, and ``check`` also re-reads our own epoch object: a writer that lost a
same-epoch race finds the other's token there and stops. The window left is the one a
server without conditional writes cannot close.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import time
import uuid
from dataclasses import dataclass, field

from runner.storage.base import StorageError, Store

_EPOCH_RE = re.compile(r"^epoch-(\d{8})$")


class LeaseLost(StorageError):
    """A newer writer holds this job's lease: this one must stop writing."""


def _epoch_key(job_prefix: str, epoch: int) -> str:
    return f"{job_prefix.strip('/')}/lease/epoch-{epoch:08d}"


def _epochs(store: Store, job_prefix: str) -> list[int]:
    base = f"{job_prefix.strip('/')}/lease/"
    found = (_EPOCH_RE.match(k[len(base):]) for k in store.list(base))
    return sorted(int(m.group(1)) for m in found if m)


def _describe(raw: bytes | None) -> str:
    try:
        body = json.loads(raw or b"")
        return f"{body.get('owner', '?')} (host {body.get('host', '?')})"
    except (ValueError, AttributeError):
        return "an unknown writer"


@dataclass
class Lease:
    store: Store
    job_prefix: str
    owner: str
    epoch: int
    body: bytes = field(repr=False)

    @classmethod
    def acquire(cls, store: Store, job_prefix: str, owner: str, attempts: int = 20) -> Lease:
        """Claim the next epoch for ``job_prefix``; retries when another writer wins one."""
        for _ in range(attempts):
            epoch = max(_epochs(store, job_prefix), default=0) + 1
            body = json.dumps({"owner": owner, "epoch": epoch, "token": uuid.uuid4().hex,
                               "host": socket.gethostname(), "pid": os.getpid(),
                               "created": time.time()}, sort_keys=True).encode()
            key = _epoch_key(job_prefix, epoch)
            if store.put_bytes(key, body, if_absent=True) and (
                    store.conditional_writes or store.get_bytes(key) == body):
                return cls(store, job_prefix, owner, epoch, body)
            time.sleep(random.uniform(0.01, 0.1))
        raise StorageError(f"could not claim a lease for {store.url}/{job_prefix} after "
                           f"{attempts} attempts (many writers starting at once?)")

    def check(self) -> None:
        """Raise LeaseLost (one line naming the newer owner and epoch) if this writer has
        been superseded."""
        newer = [e for e in _epochs(self.store, self.job_prefix) if e > self.epoch]
        if newer:
            who = _describe(self.store.get_bytes(_epoch_key(self.job_prefix, newer[-1])))
            raise LeaseLost(f"lease lost: {who} took over {self.store.url}/{self.job_prefix} "
                            f"at epoch {newer[-1]} (this writer, {self.owner}, holds epoch "
                            f"{self.epoch}); stopping without committing")
        if not self.store.conditional_writes:
            raw = self.store.get_bytes(_epoch_key(self.job_prefix, self.epoch))
            if raw != self.body:
                raise LeaseLost(f"lease lost: {_describe(raw)} claimed epoch {self.epoch} of "
                                f"{self.store.url}/{self.job_prefix} too (this writer: "
                                f"{self.owner}); stopping without committing")
