"""Stable identities for inputs and outputs: hashes of JSON-able descriptions and files.

Everything cached by the data layer (tokenizers, shard directories) is keyed by one of
these, so the same inputs find the same cache entry and different inputs never do.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(obj: Any, length: int = 16) -> str:
    """Hex digest of a JSON-able object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def unit_hash(key: str) -> float:
    """A key's deterministic position in [0, 1): used to assign documents to splits."""
    h = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64
