"""AWS: IMDS's ``spot/instance-action``, two minutes ahead of a spot interruption."""

from __future__ import annotations

import http.client
import json
import time

from runner.preemption.http import describe, request
from runner.preemption.notices import MetadataError, Notice, iso_utc, snippet, text_of
from runner.preemption.providers import SpotProvider

WINDOW_S = 120.0  # "two minutes" (the interruption notice's documentation)
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
PROBE_PATH = "/latest/meta-data/instance-id"
_TOKEN_TTL_S = 21600  # the maximum; the poller renews a minute before it lapses
_ACTIONS = ("terminate", "stop", "hibernate")


def parse_aws_instance_action(status: int, body: bytes | str, now: float) -> Notice | None:
    """IMDS ``spot/instance-action``: 404 while nothing is scheduled, 200 once it is.

    The body is ``{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601 UTC}``.
    Any of the three actions ends the process, so all are notices; an unreadable time
    gets the documented two minutes as deadline. A 200 with anything else (a captive
    portal's or proxy's page, bad JSON) is not a notice but a MetadataError, which the
    watcher reports and polls past: taken as a notice, it stopped every attempt of a
    job after one step, forever.
    """
    if status == 404:
        return None
    if status != 200:
        raise MetadataError(f"AWS spot/instance-action returned HTTP {status}")
    try:
        doc = json.loads(text_of(body))
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("action") not in _ACTIONS:
        raise MetadataError(f"AWS spot/instance-action answered HTTP 200 with something "
                            f"that is not an instance-action ({snippet(body)}); is a proxy "
                            "answering for the metadata service?")
    action, when = doc.get("action"), doc.get("time")
    deadline = iso_utc(when)
    return Notice("aws", now, now + WINDOW_S if deadline is None else deadline,
                  f"spot {action} at {when}")


class AwsPoller:
    """IMDSv2: a session token from a PUT, then GETs that carry it (renewed on 401).

    When no token can be had (in Docker with the default hop limit of 1 the PUT's
    answer never arrives) a tokenless IMDSv1 GET is tried; if the instance still
    allows v1 the poller keeps using it rather than paying a PUT timeout per poll.
    """

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base, self.timeout_s = base.rstrip("/"), timeout_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._tokenless = False

    def poll(self, now: float) -> Notice | None:
        status, body = self._get_action()
        if status == 401:  # the token lapsed, IMDS restarted, or v1 was turned off: retry once
            self._token, self._tokenless = None, False
            status, body = self._get_action()
        return parse_aws_instance_action(status, body, now)

    def _get_action(self) -> tuple[int, bytes]:
        url = self.base + ACTION_PATH
        if self._tokenless:
            return request("GET", url, {}, self.timeout_s)[:2]
        try:
            headers = {"X-aws-ec2-metadata-token": self._session_token()}
        except MetadataError as token_error:
            status, body, _ = request("GET", url, {}, self.timeout_s)
            if status == 401:  # IMDSv2 only: the token problem is the one to report
                raise token_error from None
            self._tokenless = True
            return status, body
        return request("GET", url, headers, self.timeout_s)[:2]

    def _session_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires:
            return self._token
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(_TOKEN_TTL_S)}
        try:
            status, body, _ = request("PUT", self.base + TOKEN_PATH, headers, self.timeout_s)
        except OSError as err:
            hint = ""
            if "timed out" in describe(err):
                hint = ("; inside a container the token needs a metadata hop limit of 2 "
                        "(aws ec2 modify-instance-metadata-options "
                        "--http-put-response-hop-limit 2) or host networking")
            raise MetadataError(f"IMDSv2 token request failed: {describe(err)}{hint}") from None
        if status != 200 or not body:
            raise MetadataError(f"IMDSv2 token request returned HTTP {status}")
        self._token = text_of(body).strip()
        self._token_expires = time.monotonic() + _TOKEN_TTL_S - 60
        return self._token


def probe(base: str, timeout_s: float) -> bool:
    """An instance id (``i-…``) read with an IMDSv2 token, or the 401 of IMDSv2-only.

    The 401 fallback matters in Docker: with the default hop limit of 1 the token
    PUT's answer never reaches the container, but a bare GET's does. Checking the
    id's shape keeps a server that answers 200 to everything from passing as AWS.
    """
    headers = {}
    try:
        status, body, _ = request("PUT", base + TOKEN_PATH,
                                  {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout_s)
        if status == 200 and body.strip():
            headers["X-aws-ec2-metadata-token"] = text_of(body).strip()
    except (OSError, http.client.HTTPException):
        pass
    status, body, _ = request("GET", base + PROBE_PATH, headers, timeout_s)
    return status == 401 or (status == 200 and text_of(body).startswith("i-"))


PROVIDER = SpotProvider("aws", title="AWS", window_s=WINDOW_S, endpoint="http://169.254.169.254",
                        probe=probe, poller=AwsPoller, order=1)
