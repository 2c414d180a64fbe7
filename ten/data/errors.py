"""The one exception the data layer raises for anything a user can cause or fix.

``str(DataError(...))`` is a single line that says what is wrong and what to change
or re-run, so the runner can print it as-is (no traceback) and exit non-zero.
"""

from __future__ import annotations


class DataError(Exception):
    """A data problem the user can fix: bad config, bad input, stale or corrupt shards."""

    def __init__(self, message: str) -> None:
        # Keep it one line whatever the caller passed: multi-line messages get folded.
        super().__init__(" ".join(message.split()))
