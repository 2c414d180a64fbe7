"""The metadata services over HTTP: one poller per cloud, cloud detection, and the
provider a job's ``resources.spot_notice`` names. A thin layer on ``urllib.request``
that tests point at a local server through the base URLs.

A provider's metadata service is reachable only from inside its VMs, so nothing here
is exercised against the real thing in CI; the response shapes follow the providers'
documentation, summarised in each parser's docstring (:mod:`.notices`)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from runner.preemption.notices import (
    PROVIDERS,
    MetadataError,
    Notice,
    _check_provider,
    _text,
    parse_aws_instance_action,
    parse_azure_scheduled_events,
    parse_gcp_preempted,
)

DEFAULT_ENDPOINTS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_PROBE_PATH = "/latest/meta-data/instance-id"
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_PROBE_PATH = "/metadata/instance?api-version=2021-02-01"

_AWS_TOKEN_TTL_S = 21600  # the maximum; the poller renews a minute before it lapses
# Azure enables Scheduled Events on the first request and documents that this
# first answer can take up to two minutes; later ones are immediate.
_AZURE_FIRST_CALL_TIMEOUT_S = 120.0
_MAX_BODY = 64 * 1024


def resolve_provider(setting: str, endpoints: Mapping[str, str] | None = None) -> str | None:
    """Map a config value ("auto", "none", or a provider) to the provider to watch."""
    if setting == "none":
        return None
    if setting == "auto":
        return detect_provider(dict(endpoints) if endpoints else None)
    return _check_provider(setting)


# ---------------------------------------------------------------- HTTP


# Metadata services are link-local: never route them through an HTTP(S)_PROXY
# from the environment, which would send the request (and a token) elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(method: str, url: str, headers: Mapping[str, str], timeout_s: float):
    """(status, body, headers) for any HTTP answer; raises OSError when there is none."""
    data = b"" if method == "PUT" else None
    req = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(_MAX_BODY), resp.headers
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read(_MAX_BODY), err.headers


def _describe(err: BaseException) -> str:
    """One line for a failed request, without the traceback."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err = err.reason if isinstance(err.reason, BaseException) else err
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


class _AwsPoller:
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
        url = self.base + AWS_ACTION_PATH
        if self._tokenless:
            return _request("GET", url, {}, self.timeout_s)[:2]
        try:
            headers = {"X-aws-ec2-metadata-token": self._session_token()}
        except MetadataError as token_error:
            status, body, _ = _request("GET", url, {}, self.timeout_s)
            if status == 401:  # IMDSv2 only: the token problem is the one to report
                raise token_error from None
            self._tokenless = True
            return status, body
        return _request("GET", url, headers, self.timeout_s)[:2]

    def _session_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires:
            return self._token
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(_AWS_TOKEN_TTL_S)}
        try:
            status, body, _ = _request("PUT", self.base + AWS_TOKEN_PATH, headers, self.timeout_s)
        except OSError as err:
            hint = ""
            if "timed out" in _describe(err):
                hint = ("; inside a container the token needs a metadata hop limit of 2 "
                        "(aws ec2 modify-instance-metadata-options "
                        "--http-put-response-hop-limit 2) or host networking")
            raise MetadataError(f"IMDSv2 token request failed: {_describe(err)}{hint}") from None
        if status != 200 or not body:
            raise MetadataError(f"IMDSv2 token request returned HTTP {status}")
        self._token = _text(body).strip()
        self._token_expires = time.monotonic() + _AWS_TOKEN_TTL_S - 60
        return self._token


class _GcpPoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + GCP_PREEMPTED_PATH, timeout_s

    def poll(self, now: float) -> Notice | None:
        status, body, _ = _request("GET", self.url, {"Metadata-Flavor": "Google"}, self.timeout_s)
        return parse_gcp_preempted(status, body, now)


class _AzurePoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + AZURE_EVENTS_PATH, timeout_s
        self._answered = False

    def poll(self, now: float) -> Notice | None:
        timeout = self.timeout_s if self._answered else max(self.timeout_s,
                                                             _AZURE_FIRST_CALL_TIMEOUT_S)
        status, body, _ = _request("GET", self.url, {"Metadata": "true"}, timeout)
        self._answered = True
        return parse_azure_scheduled_events(status, body, now)


_POLLERS = {"aws": _AwsPoller, "gcp": _GcpPoller, "azure": _AzurePoller}


# ---------------------------------------------------------------- detection


def detect_provider(endpoints: dict[str, str] | None = None, timeout_s: float = 0.3) -> str | None:
    """Which cloud's metadata service answers here; None on a laptop.

    ``endpoints`` maps provider → base URL and limits the probe to those
    providers (None: all of them at their real addresses). The probes run in
    parallel and the whole call is bounded by about twice ``timeout_s``, DNS
    included (``metadata.google.internal`` can stall in the resolver, which no
    socket timeout covers), so a laptop pays well under a second.
    """
    targets = dict(DEFAULT_ENDPOINTS) if endpoints is None else dict(endpoints)
    for provider in targets:
        _check_provider(provider)
    answers: dict[str, bool] = {}
    threads = {
        p: threading.Thread(target=_probe_into, args=(p, url.rstrip("/"), timeout_s, answers),
                            name=f"probe-{p}", daemon=True)  # daemon: a DNS stall holds no one
        for p, url in targets.items()
    }
    for thread in threads.values():
        thread.start()
    budget_end = time.monotonic() + 2 * timeout_s + 0.1
    for provider in PROVIDERS:  # a fixed order, so the answer is deterministic
        if provider in threads:
            threads[provider].join(max(0.0, budget_end - time.monotonic()))
            if answers.get(provider):
                return provider
    return None


def _probe_into(provider: str, base: str, timeout_s: float, answers: dict[str, bool]) -> None:
    try:
        answers[provider] = _PROBES[provider](base, timeout_s)
    except Exception:  # noqa: BLE001 — refused, timed out, unresolvable: not this cloud
        answers[provider] = False


def _probe_aws(base: str, timeout_s: float) -> bool:
    """An instance id (``i-…``) read with an IMDSv2 token, or the 401 of IMDSv2-only.

    The 401 fallback matters in Docker: with the default hop limit of 1 the token
    PUT's answer never reaches the container, but a bare GET's does. Checking the
    id's shape keeps a server that answers 200 to everything from passing as AWS.
    """
    headers = {}
    try:
        status, body, _ = _request("PUT", base + AWS_TOKEN_PATH,
                                   {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout_s)
        if status == 200 and body.strip():
            headers["X-aws-ec2-metadata-token"] = _text(body).strip()
    except (OSError, http.client.HTTPException):
        pass
    status, body, _ = _request("GET", base + AWS_PROBE_PATH, headers, timeout_s)
    return status == 401 or (status == 200 and _text(body).startswith("i-"))


def _probe_gcp(base: str, timeout_s: float) -> bool:
    """GCP stamps every metadata answer with ``Metadata-Flavor: Google``; a captive
    portal that resolves every name does not."""
    status, _, headers = _request("GET", base + "/computeMetadata/v1/",
                                  {"Metadata-Flavor": "Google"}, timeout_s)
    return status == 200 and headers.get("Metadata-Flavor", "") == "Google"


def _probe_azure(base: str, timeout_s: float) -> bool:
    """Azure IMDS answers ``/metadata/instance`` with a JSON document holding ``compute``."""
    status, body, _ = _request("GET", base + AZURE_PROBE_PATH, {"Metadata": "true"}, timeout_s)
    if status != 200:
        return False
    try:
        doc = json.loads(_text(body))
    except ValueError:
        return False
    return isinstance(doc, dict) and "compute" in doc


_PROBES = {"aws": _probe_aws, "gcp": _probe_gcp, "azure": _probe_azure}
