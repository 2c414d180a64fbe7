"""The one way this package talks to a metadata service: a plain HTTP request on
``urllib.request`` that never goes through a proxy and always returns the answer."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

MAX_BODY = 64 * 1024

# Metadata services are link-local: never route them through an HTTP(S)_PROXY
# from the environment, which would send the request (and a token) elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method: str, url: str, headers: Mapping[str, str], timeout_s: float):
    """(status, body, headers) for any HTTP answer; raises OSError when there is none."""
    data = b"" if method == "PUT" else None
    req = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(MAX_BODY), resp.headers
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read(MAX_BODY), err.headers


def describe(err: BaseException) -> str:
    """One line for a failed request, without the traceback."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err = err.reason if isinstance(err.reason, BaseException) else err
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__
