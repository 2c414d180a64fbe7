"""Which cloud this machine is on, and which provider a job's
``resources.spot_notice`` names: every declared provider's probe run at once.

A provider's metadata service is reachable only from inside its VMs, so nothing here
is exercised against the real thing in CI; tests point the base URLs at a local server
that plays the services as their documentation describes them."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from runner.preemption.providers import DECLARED, spot_provider

DEFAULT_ENDPOINTS = {p.name: p.endpoint for p in DECLARED}


def resolve_provider(setting: str, endpoints: Mapping[str, str] | None = None) -> str | None:
    """Map a config value ("auto", "none", or a provider) to the provider to watch."""
    if setting == "none":
        return None
    if setting == "auto":
        return detect_provider(dict(endpoints) if endpoints else None)
    return spot_provider(setting).name


def detect_provider(endpoints: dict[str, str] | None = None, timeout_s: float = 0.3) -> str | None:
    """Which cloud's metadata service answers here; None on a laptop.

    ``endpoints`` maps provider → base URL and limits the probe to those
    providers (None: all of them at their real addresses). The probes run in
    parallel and the whole call is bounded by about twice ``timeout_s``, DNS
    included (``metadata.google.internal`` can stall in the resolver, which no
    socket timeout covers), so a laptop pays well under a second.
    """
    targets = dict(DEFAULT_ENDPOINTS) if endpoints is None else dict(endpoints)
    for name in targets:
        spot_provider(name)
    answers: dict[str, bool] = {}
    threads = {
        p: threading.Thread(target=_probe_into, args=(p, url.rstrip("/"), timeout_s, answers),
                            name=f"probe-{p}", daemon=True)  # daemon: a DNS stall holds no one
        for p, url in targets.items()
    }
    for thread in threads.values():
        thread.start()
    budget_end = time.monotonic() + 2 * timeout_s + 0.1
    for provider in DECLARED:  # in their declared order, so the answer is deterministic
        if provider.name in threads:
            threads[provider.name].join(max(0.0, budget_end - time.monotonic()))
            if answers.get(provider.name):
                return provider.name
    return None


def _probe_into(name: str, base: str, timeout_s: float, answers: dict[str, bool]) -> None:
    try:
        answers[name] = spot_provider(name).probe(base, timeout_s)
    except Exception:  # noqa: BLE001 — refused, timed out, unresolvable: not this cloud
        answers[name] = False
