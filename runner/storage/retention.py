"""Which checkpoints to keep in the bucket: a pure policy, tested from a table."""

from __future__ import annotations

from collections.abc import Iterable


def retained_steps(steps: Iterable[int], keep_last: int,
                   milestone_every: int | None = None) -> list[int]:
    """The steps to keep, oldest first: the newest ``keep_last`` of ``steps`` plus every
    step that is a multiple of ``milestone_every`` (milestones are defined on the step
    number, not on the checkpoint's position, so pruning never moves them).

    >>> retained_steps([100, 200, 300, 400, 500], keep_last=2, milestone_every=200)
    [200, 400, 500]
    """
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1 (the newest checkpoint is the resume "
                         "point)")
    if milestone_every is not None and milestone_every < 1:
        raise ValueError("milestone_every must be a positive number of steps (or None)")
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:])
    if milestone_every:
        keep |= {s for s in ordered if s > 0 and s % milestone_every == 0}
    return sorted(keep)
