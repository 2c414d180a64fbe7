"""Where ``submit --to`` can send a job, each declared by one module of this package.

A module here declares its cloud as ``CLOUD`` (a :class:`Cloud`): the name a ``--to``
target and the job's ``resources.<name>`` section use, the target's form and what the
CLI's help says of it, the module whose ``DESTINATION`` serves it (imported only when a
job goes there, so its SDK is needed only then), and its job section, if it takes keys.
The job schema, ``submit``'s help and ``runner.provision.destinations`` all read
:data:`CLOUDS`, found here: a new cloud is a module here and its provider
(runner/README.md, "Adding a cloud"), no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cloud:
    """``name``: the ``--to`` scheme and the ``resources`` key of ``section`` (None: it
    takes no keys); ``form``: how a target names it (``ssh://user@host[:port]``);
    ``summary``: what it is, for ``--help``; ``destination``: the module whose
    ``DESTINATION`` serves it; ``order``: its place in lists (then by name)."""

    name: str
    form: str
    summary: str
    destination: str
    section: Any = None
    order: int = 100

    @property
    def takes_url(self) -> bool:
        return "://" in self.form

    def has_key(self, key: str) -> bool:
        """Whether its ``resources.<name>`` section has ``key`` (``region``, say)."""
        return self.section is not None and key in self.section.model_fields


def _declared() -> tuple[Cloud, ...]:
    found = [importlib.import_module(f"{__name__}.{info.name}").CLOUD
             for info in pkgutil.iter_modules(__path__)]
    return tuple(sorted(found, key=lambda c: (c.order, c.name)))


CLOUDS: tuple[Cloud, ...] = _declared()


def scheme_of(target: str) -> str:
    """``ssh://user@host`` -> ``ssh``; ``local`` -> ``local``."""
    return target.split("://", 1)[0].lower() if "://" in target else target


def cloud_of(target: str) -> Cloud | None:
    """The cloud a ``--to`` target names by its scheme, or None (the form unchecked)."""
    return next((c for c in CLOUDS if c.name == scheme_of(target)), None)


def forms() -> str:
    """The ``--to`` forms in prose: ``local, aws or ssh://user@host[:port]``."""
    names = [c.form for c in CLOUDS]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
