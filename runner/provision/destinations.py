"""Where ``submit --to`` sends a job: one :class:`Destination` per cloud, in the module
its declaration names (``runner.job.clouds``).

A destination is what a kind of machine needs around its :class:`Provider`: checks that
refuse a job before anything is recorded or created (``preflight``), putting the job
where the machine reads it (``stage``), and building the provider for a recorded job
(``provider``). The first two default to doing nothing.

Adding a cloud is its declaration under ``runner/job/clouds/`` and one module under
``runner/provision/`` that defines its provider and a ``DESTINATION`` (a subclass of
:class:`Destination`). A destination's module is imported only when a job goes there
(``aws`` pulls in boto3).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.job.clouds import cloud_of, forms
from runner.provision.base import Provider, ProvisionError

Log = Callable[[str], None]

FORMS = forms()  # "local, aws or ssh://user@host[:port]": each cloud's --to form


class Destination:
    """A scheme's hooks around its provider; subclasses override what they need."""

    def preflight(self, job: Any, job_file: Path, target: str, *, check: bool,
                  log: Log) -> str:
        """Refuse what can be refused before the job is recorded; return the target as
        the record keeps it (a normal form). ``check``: also ask the machine (not when
        the caller built the provider)."""
        return target

    def stage(self, job: Any, job_copy: Path, job_id: str, *, check: bool) -> dict[str, Any]:
        """Put the job where its machine will read it; what to add to the record."""
        return {}

    def provider(self, record: Any, job: Callable[[], Any], log: Log) -> Provider:
        """The provider of a recorded job; ``job()`` loads the job (only when needed)."""
        raise NotImplementedError


def destination(target: str) -> Destination:
    """The destination serving ``target``; a ProvisionError naming the forms otherwise (a
    bare name where the cloud takes a URL, or the other way round, included)."""
    cloud = cloud_of(target)
    if cloud is None or cloud.takes_url != ("://" in target):
        raise ProvisionError(f"--to {target!r}: use {FORMS}")
    return importlib.import_module(cloud.destination).DESTINATION
