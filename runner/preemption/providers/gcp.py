"""GCP: the metadata server's ``instance/preempted`` flag, ~30 s ahead of the stop."""

from __future__ import annotations

from runner.preemption.http import request
from runner.preemption.notices import MetadataError, Notice, snippet, text_of
from runner.preemption.providers import SpotProvider

# "30 seconds": the flag is set when the ACPI soft-off starts
WINDOW_S = 30.0
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"


def parse_gcp_preempted(status: int, body: bytes | str, now: float) -> Notice | None:
    """``instance/preempted`` is ``TRUE`` from the start of the ~30 s notice, else ``FALSE``.

    GCP gives no timestamp, so the deadline is ``now`` + 30 s; the flag may have
    been set up to one poll interval earlier, which startup_warning accounts for.
    """
    if status != 200:
        raise MetadataError(f"GCP instance/preempted returned HTTP {status}")
    value = text_of(body).strip().upper()
    if value == "FALSE":
        return None
    if value == "TRUE":
        return Notice("gcp", now, now + WINDOW_S, "instance/preempted is TRUE")
    raise MetadataError(f"GCP instance/preempted returned {snippet(body)}, not TRUE/FALSE")


class GcpPoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + PREEMPTED_PATH, timeout_s

    def poll(self, now: float) -> Notice | None:
        status, body, _ = request("GET", self.url, {"Metadata-Flavor": "Google"}, self.timeout_s)
        return parse_gcp_preempted(status, body, now)


def probe(base: str, timeout_s: float) -> bool:
    """GCP stamps every metadata answer with ``Metadata-Flavor: Google``; a captive
    portal that resolves every name does not."""
    status, _, headers = request("GET", base + "/computeMetadata/v1/",
                                 {"Metadata-Flavor": "Google"}, timeout_s)
    return status == 200 and headers.get("Metadata-Flavor", "") == "Google"


PROVIDER = SpotProvider("gcp", title="GCP", window_s=WINDOW_S,
                        endpoint="http://metadata.google.internal", probe=probe,
                        poller=GcpPoller, order=2)
