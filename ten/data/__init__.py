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

from ten.data.config import DataConfig
from ten.data.errors import DataError
from ten.data.pipeline import ShardData, StreamData, open_data
from ten.data.sources import KNOWN
from ten.data.tokenizer import Tokenizer

__all__ = ["KNOWN", "DataConfig", "DataError", "ShardData", "StreamData", "Tokenizer",
           "open_data"]
