"""The metadata services that announce a spot machine's preemption, each declared by
one module of this package.

A module here declares its provider as ``PROVIDER`` (a :class:`SpotProvider`): the
name ``resources.spot_notice`` takes, how messages call it, its documented notice, its
metadata service's address, how to tell it answers here (detection) and a poller that
reads its notice. Detection, the watcher, the deadline maths and the job schema all
read :data:`DECLARED`, found here: a cloud whose machines announce preemption adds a
module, no list to edit (runner/README.md, "Adding a cloud").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from runner.preemption.notices import Notice


class Poller(Protocol):
    def poll(self, now: float) -> Notice | None:
        """The notice if one is out (``now``: epoch seconds), None if not; raises
        MetadataError or OSError when the service gives no readable answer."""


@dataclass(frozen=True)
class SpotProvider:
    """``name``: the ``resources.spot_notice`` value; ``title``: its name in messages;
    ``window_s``: the notice its documentation promises; ``endpoint``: its metadata
    service's base URL; ``probe(base, timeout_s)``: whether that service answers at
    ``base``; ``poller(base, timeout_s)``: a :class:`Poller` of it; ``order``: its
    place in lists and its precedence when two answer (then by name)."""

    name: str
    title: str
    window_s: float
    endpoint: str
    probe: Callable[[str, float], bool]
    poller: Callable[[str, float], Poller]
    order: int = 100


def _declared() -> tuple[SpotProvider, ...]:
    found = [importlib.import_module(f"{__name__}.{info.name}").PROVIDER
             for info in pkgutil.iter_modules(__path__)]
    return tuple(sorted(found, key=lambda p: (p.order, p.name)))


DECLARED: tuple[SpotProvider, ...] = _declared()
NAMES: tuple[str, ...] = tuple(p.name for p in DECLARED)


def spot_provider(name: str) -> SpotProvider:
    """The provider of that name; ValueError naming the choices for any other."""
    for provider in DECLARED:
        if provider.name == name:
            return provider
    raise ValueError(f"unknown cloud provider {name!r}: expected one of {', '.join(NAMES)}")
