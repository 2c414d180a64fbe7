"""The data layer: sources -> sentencepiece tokenizer -> packed token batches.

Three modes, one interface (see :func:`open_data`):

* ``pretokenized`` (the fast path): tokenize once, in parallel, into headered shards;
  training reads memory-mapped windows.
* ``streaming``: tokenize on the fly in DataLoader workers; first batch in seconds.
* ``download``: ``datasets.load_dataset`` + ``map(num_proc)`` into the same shards.

Every loader has a small JSON cursor (``state_dict``) from which a fresh loader yields
exactly the batches that would have come next. Problems a user can fix raise
:class:`DataError` with a one-line message.
"""

from ten.data.config import DataConfig, TokenizerConfig
from ten.data.errors import DataError

__all__ = ["KNOWN", "DataConfig", "DataError", "ShardData", "StreamData", "Tokenizer",
           "TokenizerConfig", "open_data"]

# The pipeline imports torch; the configs and the error do not, so the job schema can
# read DataConfig without it. The rest loads on first use.
_LAZY = {"ShardData": "ten.data.pipeline", "StreamData": "ten.data.pipeline",
         "open_data": "ten.data.pipeline", "KNOWN": "ten.data.sources",
         "Tokenizer": "ten.data.tokenizer"}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'ten.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
