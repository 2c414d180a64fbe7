"""Spot-preemption notices: parsers and deadline maths from tables, the watcher and
detection against a local HTTP server that plays the three metadata services."""

import json
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runner.preemption import (
    PROVIDERS,
    MetadataError,
    Notice,
    NoticeWatcher,
    _ErrorThrottle,
    detect_provider,
    emergency_report,
    notice_window_s,
    parse_aws_instance_action,
    parse_azure_scheduled_events,
    parse_gcp_preempted,
    resolve_provider,
    startup_warning,
    time_left_s,
)

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a fixed "now" for the pure functions
T_ISO = "2027-01-15T08:01:40Z"  # NOW + 100 s
T_RFC = "Fri, 15 Jan 2027 08:00:25 GMT"  # NOW + 25 s


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize("body", [
    '{"action": "terminate", "time": ', "[1, 2]", b"<html><body>Sign in to the Wi-Fi</body>",
    b"\x00\xff" * 100, json.dumps({"action": "reboot"}), ""])
def test_a_200_that_is_not_an_instance_action_is_an_error_not_a_notice(body):
    """Issue 23: behind a proxy answering 200 to everything, each attempt stopped after
    one step; such an answer is reported (and polled past), never a notice."""
    with pytest.raises(MetadataError, match="not an instance-action"):
        parse_aws_instance_action(200, body, NOW)


@pytest.mark.parametrize(
    "status, body, deadline, detail",
    [
        (404, "", None, None),
        (404, b"<html>Not Found</html>", None, None),
        (200, json.dumps({"action": "terminate", "time": T_ISO}), NOW + 100, "spot terminate"),
        (200, json.dumps({"action": "stop", "time": T_ISO}), NOW + 100, "spot stop"),
        (200, json.dumps({"action": "hibernate", "time": T_ISO}).encode(), NOW + 100,
         "spot hibernate"),
        (200, json.dumps({"action": "terminate", "time": "2027-01-15T08:01:40"}), NOW + 100,
         "spot terminate"),  # no zone: IMDS times are UTC
        # an unreadable time: the documented two minutes as deadline
        (200, json.dumps({"action": "terminate", "time": "soon"}), NOW + 120, "spot terminate"),
        (200, json.dumps({"action": "terminate"}), NOW + 120, "spot terminate"),
    ],
)
def test_parse_aws(status, body, deadline, detail):
    notice = parse_aws_instance_action(status, body, NOW)
    if deadline is None:
        assert notice is None
        return
    assert notice.provider == "aws" and notice.received_at == NOW
    assert notice.deadline == pytest.approx(deadline)
    assert detail in notice.detail


@pytest.mark.parametrize(
    "status, body, notice",
    [
        (200, "FALSE", False),
        (200, b"FALSE", False),
        (200, "TRUE", True),
        (200, "TRUE\n", True),
        (200, "true", True),
    ],
)
def test_parse_gcp(status, body, notice):
    got = parse_gcp_preempted(status, body, NOW)
    if not notice:
        assert got is None
        return
    assert (got.provider, got.received_at, got.deadline) == ("gcp", NOW, NOW + 30)


@pytest.mark.parametrize(
    "status, body, match",
    [
        (200, "", "not TRUE/FALSE"),
        (200, "<html>captive portal</html>", "not TRUE/FALSE"),
        (403, "Missing Metadata-Flavor:Google header", "HTTP 403"),
        (503, "", "HTTP 503"),
    ],
)
def test_parse_gcp_errors(status, body, match):
    with pytest.raises(MetadataError, match=match):
        parse_gcp_preempted(status, body, NOW)


def _event(kind, not_before=T_RFC, event_id="602d9444"):
    return {"EventId": event_id, "EventStatus": "Scheduled", "EventType": kind,
            "ResourceType": "VirtualMachine", "Resources": ["vm0"], "NotBefore": not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}


def _events(*events):
    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)})


@pytest.mark.parametrize(
    "body, deadline, detail",
    [
        (_events(), None, None),
        (_events(_event("Reboot")), None, None),
        (_events(_event("Freeze"), _event("Redeploy")), None, None),
        (_events(_event("Preempt")), NOW + 25, "Preempt 602d9444"),
        (_events(_event("Freeze"), _event("Preempt", event_id="e2")), NOW + 25, "Preempt e2"),
        (_events(_event("Terminate")), NOW + 25, "Terminate"),
        # the earliest of several notices wins
        (_events(_event("Terminate", "Fri, 15 Jan 2027 08:05:00 GMT"), _event("Preempt")),
         NOW + 25, "Preempt"),
        # NotBefore is empty once the event has started: the documented 30 s
        (_events(_event("Preempt", not_before="")), NOW + 30, "(now)"),
        (_events(_event("Preempt", not_before="whenever")), NOW + 30, "Preempt"),
        # entries that are not objects are skipped, not fatal
        (json.dumps({"DocumentIncarnation": 1, "Events": ["x", _event("Preempt")]}),
         NOW + 25, "Preempt"),
    ],
)
def test_parse_azure(body, deadline, detail):
    notice = parse_azure_scheduled_events(200, body, NOW)
    if deadline is None:
        assert notice is None
        return
    assert notice.provider == "azure" and notice.received_at == NOW
    assert notice.deadline == pytest.approx(deadline)
    assert detail in notice.detail


@pytest.mark.parametrize(
    "status, body, match",
    [
        (200, '{"DocumentIncarnation": 1, "Events": [', "returned"),
        (200, "", "returned"),
        (200, "[]", "no Events list"),
        (200, '{"DocumentIncarnation": 1}', "no Events list"),
        (200, '{"Events": "Preempt"}', "no Events list"),
        (400, '{"error": "Bad request"}', "HTTP 400"),
    ],
)
def test_parse_azure_errors(status, body, match):
    with pytest.raises(MetadataError, match=match):
        parse_azure_scheduled_events(status, body, NOW)


def test_parse_errors_are_one_line():
    with pytest.raises(MetadataError) as err:
        parse_azure_scheduled_events(200, "{\n" + "x" * 500 + "\n", NOW)
    assert "\n" not in str(err.value) and len(str(err.value)) < 150


# ---------------------------------------------------------------- deadline maths


@pytest.mark.parametrize("provider, window", [("aws", 120), ("gcp", 30), ("azure", 30)])
def test_notice_window(provider, window):
    assert notice_window_s(provider) == window


def test_unknown_provider_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"^unknown cloud provider 'oracle': expected one of "
                                         r"aws, gcp, azure$"):
        notice_window_s("oracle")
    with pytest.raises(ValueError, match="unknown cloud provider"):
        NoticeWatcher("oracle", lambda n: None)


@pytest.mark.parametrize(
    "provider, last_s, latency_s, expected",
    [
        ("gcp", 95.0, 0.0,
         "last checkpoint upload took 95 s; the GCP notice window is 30 s: a preemption will "
         "lose work since the last periodic checkpoint — checkpoint more often or make "
         "checkpoints smaller"),
        ("azure", 31.2, 0.0,
         "last checkpoint upload took 31 s; the Azure notice window is 30 s: a preemption will "
         "lose work since the last periodic checkpoint — checkpoint more often or make "
         "checkpoints smaller"),
        ("aws", 95.0, 5.0, None),
        ("aws", 121.0, 0.0,
         "last checkpoint upload took 121 s; the AWS notice window is 120 s: a preemption will "
         "lose work since the last periodic checkpoint — checkpoint more often or make "
         "checkpoints smaller"),
        ("gcp", 30.0, 0.0, None),  # exactly fits
        ("gcp", 4.2, 5.0, None),
        ("gcp", None, 5.0, None),  # nothing measured yet
        ("gcp", 27.0, 5.0,
         "last checkpoint upload took 27 s; the GCP notice window is 30 s and the notice may be "
         "seen 5.0 s late: an emergency checkpoint may not finish in time — checkpoint more "
         "often or make checkpoints smaller, or poll more often"),
    ],
)
def test_startup_warning(provider, last_s, latency_s, expected):
    assert startup_warning(provider, last_s, latency_s) == expected


@pytest.mark.parametrize(
    "received, deadline, committed, expected",
    [
        (1000.0, 1030.0, 1012.3,
         "emergency checkpoint committed 12.3 s after the notice, 17.7 s before the deadline"),
        (1000.0, 1030.0, 1034.1,
         "emergency checkpoint committed 34.1 s after the notice, 4.1 s AFTER the deadline"),
        (1000.0, 1030.0, 1030.0,
         "emergency checkpoint committed 30.0 s after the notice, 0.0 s before the deadline"),
        (1000.0, None, 1003.0,
         "emergency checkpoint committed 3.0 s after the notice (the GCP deadline is unknown)"),
    ],
)
def test_emergency_report(received, deadline, committed, expected):
    notice = Notice("gcp", received, deadline, "instance/preempted is TRUE")
    assert emergency_report(notice, committed) == expected


def test_time_left():
    notice = Notice("aws", NOW, NOW + 100, "")
    assert time_left_s(notice, NOW + 40) == 60
    assert time_left_s(notice, NOW + 130) == -30
    assert time_left_s(Notice("aws", NOW, None, ""), NOW) is None
    assert 0 < time_left_s(Notice("gcp", time.time(), time.time() + 30, "")) <= 30


@pytest.mark.parametrize(
    "events, expected",
    [
        # (kind, now) → what on_error/on_success returns
        ([("err", 0.0)], [0]),  # the first failure is reported at once
        ([("err", 0.0), ("err", 1.0), ("err", 59.0)], [0, None, None]),
        ([("err", 0.0), ("err", 1.0), ("err", 2.0), ("err", 60.0)], [0, None, None, 2]),
        ([("err", 0.0), ("err", 1.0), ("ok", 2.0)], [0, None, 2]),
        ([("ok", 0.0)], [0]),  # nothing had failed: nothing to report
        ([("err", 0.0), ("ok", 1.0), ("err", 2.0)], [0, 1, 0]),  # a new outage reports at once
    ],
)
def test_error_throttle(events, expected):
    throttle = _ErrorThrottle(every_s=60.0)
    got = [throttle.on_error(now) if kind == "err" else throttle.on_success()
           for kind, now in events]
    assert got == expected


# ---------------------------------------------------------------- a fake metadata service


class FakeCloud:
    """One local server playing all three metadata services, like 169.254.169.254.

    ``providers`` says which of them answer; ``notice`` flips every service from
    "nothing scheduled" to "preemption scheduled"; ``portal`` answers every request
    with 200 HTML like a captive portal.
    """

    def __init__(self):
        self.providers = set(PROVIDERS)
        self.notice = False
        self.portal = False
        self.aws_put_works = True  # False: the token PUT is refused (hop limit, in effect)
        self.imds_v1 = False  # True: tokenless GETs are allowed too
        self.aws_time = T_ISO
        self.azure_not_before = T_RFC
        self.tokens: set[str] = set()
        self.hits = 0
        self.port = 0
        self.server = None
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        handler = type("Handler", (_Handler,), {"cloud": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    cloud: FakeCloud

    def log_message(self, *args):  # keep pytest output clean
        pass

    def send(self, status, body="", headers=()):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        self.cloud.hits += 1
        if self.cloud.portal:
            return self.send(200, "<html>welcome</html>")
        if self.path != "/latest/api/token" or "aws" not in self.cloud.providers:
            return self.send(404)
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if not self.cloud.aws_put_works:
            return self.send(403)
        if not ttl:
            return self.send(400)
        token = secrets.token_urlsafe(16)
        self.cloud.tokens.add(token)
        self.send(200, token, [("X-aws-ec2-metadata-token-ttl-seconds", ttl)])

    def do_GET(self):
        self.cloud.hits += 1
        cloud, path = self.cloud, self.path
        if cloud.portal:
            return self.send(200, "<html>welcome</html>")
        if path.startswith("/latest/") and "aws" in cloud.providers:
            return self.aws(path)
        if path.startswith("/computeMetadata/") and "gcp" in cloud.providers:
            return self.gcp(path)
        if path.startswith("/metadata/") and "azure" in cloud.providers:
            return self.azure(path)
        self.send(404)

    def aws(self, path):
        token = self.headers.get("X-aws-ec2-metadata-token")
        if token not in self.cloud.tokens and not (self.cloud.imds_v1 and token is None):
            return self.send(401)  # IMDSv2 only, or a token IMDS never issued
        if path == "/latest/meta-data/instance-id":
            return self.send(200, "i-0123456789abcdef0")
        if path == "/latest/meta-data/spot/instance-action" and self.cloud.notice:
            return self.send(200, json.dumps({"action": "terminate", "time": self.cloud.aws_time}))
        self.send(404)

    def gcp(self, path):
        flavor = [("Metadata-Flavor", "Google")]
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.send(403, "Missing Metadata-Flavor:Google header", flavor)
        if path == "/computeMetadata/v1/":
            return self.send(200, "instance/\nproject/\n", flavor)
        if path == "/computeMetadata/v1/instance/preempted":
            return self.send(200, "TRUE" if self.cloud.notice else "FALSE", flavor)
        self.send(404, "", flavor)

    def azure(self, path):
        if self.headers.get("Metadata") != "true" or "api-version=" not in path:
            return self.send(400, json.dumps({"error": "Bad request"}))
        if path.startswith("/metadata/instance?"):
            return self.send(200, json.dumps({"compute": {"vmId": "x"}, "network": {}}))
        if path.startswith("/metadata/scheduledevents?"):
            events = [_event("Freeze")]  # maintenance: never a notice
            if self.cloud.notice:
                events.append(_event("Preempt", self.cloud.azure_not_before))
            return self.send(200, _events(*events))
        self.send(404)


@pytest.fixture
def cloud():
    fake = FakeCloud()
    yield fake
    fake.stop()


def _closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens: connection refused


def _wait(predicate, timeout_s=2.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class Recorder:
    """on_notice and log in one place, thread-safe enough for list.append."""

    def __init__(self):
        self.notices: list[Notice] = []
        self.lines: list[str] = []

    def on_notice(self, notice):
        self.notices.append(notice)

    def log(self, line):
        self.lines.append(line)

    def matching(self, text):
        return [line for line in self.lines if text in line]


def test_fake_cloud_enforces_the_imdsv2_handshake(cloud):
    url = cloud.url + "/latest/meta-data/spot/instance-action"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=1)
    assert err.value.code == 401
    req = urllib.request.Request(url, headers={"X-aws-ec2-metadata-token": "forged"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=1)
    assert err.value.code == 401


# ---------------------------------------------------------------- the watcher


def _expected_deadline(provider, notice):
    return {
        "aws": datetime(2027, 1, 15, 8, 1, 40, tzinfo=timezone.utc).timestamp(),
        "azure": datetime(2027, 1, 15, 8, 0, 25, tzinfo=timezone.utc).timestamp(),
        "gcp": notice.received_at + 30,
    }[provider]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_watcher_calls_back_once_on_the_first_notice(cloud, provider):
    rec = Recorder()
    hits_at_callback = []

    def on_notice(notice):
        hits_at_callback.append(cloud.hits)
        rec.on_notice(notice)

    watcher = NoticeWatcher(provider, on_notice, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    try:
        assert _wait(lambda: cloud.hits >= 3)  # a few "nothing scheduled" polls
        assert rec.notices == [] and watcher.notice is None
        cloud.notice = True
        hits_at_flip = cloud.hits
        assert _wait(lambda: rec.notices)
        # Seen by the poll after the flip (or the one in flight): counted in requests to
        # the metadata service (two a poll with IMDSv2's token), not in seconds.
        assert hits_at_callback[0] - hits_at_flip <= 4
        # The notice stays up; the watcher's work is done: its thread ends by itself.
        assert _wait(lambda: not watcher._thread.is_alive())
    finally:
        watcher.stop()
    assert len(rec.notices) == 1
    notice = rec.notices[0]
    assert watcher.notice is notice and notice.provider == provider
    assert notice.deadline == pytest.approx(_expected_deadline(provider, notice))
    assert not rec.matching("cannot read"), rec.lines
    assert len(rec.matching("notice (")) == 1


def test_watcher_renews_a_lapsed_aws_token(cloud):
    rec = Recorder()
    watcher = NoticeWatcher("aws", rec.on_notice, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    try:
        assert _wait(lambda: cloud.tokens)
        cloud.tokens.clear()  # IMDS forgot every token: the next GET is a 401
        cloud.notice = True
        assert _wait(lambda: rec.notices, timeout_s=1.0)
    finally:
        watcher.stop()
    assert len(cloud.tokens) == 1 and not rec.matching("cannot read")


def test_watcher_falls_back_to_imdsv1_when_no_token_can_be_had(cloud):
    cloud.aws_put_works, cloud.imds_v1 = False, True
    rec = Recorder()
    watcher = NoticeWatcher("aws", rec.on_notice, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    try:
        assert _wait(lambda: cloud.hits >= 4)
        cloud.notice = True
        assert _wait(lambda: rec.notices, timeout_s=1.0)
    finally:
        watcher.stop()
    assert not rec.matching("cannot read") and not cloud.tokens


def test_watcher_reports_an_imdsv2_token_failure_once(cloud):
    cloud.aws_put_works = False  # and IMDSv2 only: nothing can be read
    rec = Recorder()
    watcher = NoticeWatcher("aws", rec.on_notice, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    try:
        assert _wait(lambda: cloud.hits >= 10)
    finally:
        watcher.stop()
    errors = rec.matching("cannot read the AWS spot notice")
    assert len(errors) == 1 and "IMDSv2 token request returned HTTP 403" in errors[0]
    assert rec.notices == []


def test_watcher_survives_the_service_going_away(cloud):
    rec = Recorder()
    watcher = NoticeWatcher("gcp", rec.on_notice, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    try:
        assert _wait(lambda: cloud.hits >= 2)
        cloud.stop()  # connection refused from now on
        time.sleep(0.4)  # several failed polls
        errors = rec.matching("cannot read the GCP spot notice")
        assert len(errors) == 1, rec.lines  # throttled: one line, not one per poll
        assert "refused" in errors[0].lower() and "\n" not in errors[0]
        assert watcher._thread.is_alive()
        cloud.start()  # back on the same port, now with a notice
        cloud.notice = True
        assert _wait(lambda: rec.notices, timeout_s=1.0)
    finally:
        watcher.stop()
    assert len(rec.notices) == 1
    assert rec.matching("answers again after")


def test_watcher_stop_is_prompt(cloud):
    rec = Recorder()
    watcher = NoticeWatcher("azure", rec.on_notice, interval_s=30.0, endpoint=cloud.url,
                            log=rec.log).start()
    assert _wait(lambda: cloud.hits >= 1)
    watcher.stop()
    # stop() joins for at most a request's timeout, far below the 30 s poll interval: a
    # thread still alive would be one sleeping out the interval.
    assert watcher._join_s < 30.0 / 4
    assert not watcher._thread.is_alive() and rec.notices == []


def test_watcher_stop_is_prompt_while_the_service_is_down():
    watcher = NoticeWatcher("aws", lambda n: None, interval_s=30.0,
                            endpoint=_closed_port_url(), log=lambda line: None).start()
    assert _wait(lambda: watcher._thread.is_alive())
    watcher.stop()  # a failed poll backs off; stop must cut the back-off short
    assert watcher._join_s < 30.0 / 4 and not watcher._thread.is_alive()


def test_a_failing_callback_is_logged_not_raised(cloud):
    rec = Recorder()
    cloud.notice = True

    def explode(notice):
        raise RuntimeError("disk full")

    watcher = NoticeWatcher("gcp", explode, interval_s=0.05, endpoint=cloud.url,
                            log=rec.log).start()
    assert _wait(lambda: rec.matching("on_notice failed"))
    watcher.stop()
    assert rec.matching("on_notice failed: RuntimeError: disk full")
    assert watcher.notice is not None and not watcher._thread.is_alive()


def test_watcher_start_twice_is_refused(cloud):
    watcher = NoticeWatcher("gcp", lambda n: None, interval_s=0.05, endpoint=cloud.url,
                            log=lambda line: None).start()
    try:
        with pytest.raises(RuntimeError, match="twice"):
            watcher.start()
    finally:
        watcher.stop()


# ---------------------------------------------------------------- detection


@pytest.mark.parametrize("provider", PROVIDERS)
def test_detect_provider(cloud, provider):
    cloud.providers = {provider}
    started = time.monotonic()
    assert detect_provider({p: cloud.url for p in PROVIDERS}) == provider
    assert time.monotonic() - started < 1.0


def test_detect_aws_when_the_token_put_cannot_reach_the_container(cloud):
    cloud.providers = {"aws"}
    cloud.aws_put_works = False  # as in Docker with hop limit 1: only the bare GET's 401 is left
    assert detect_provider({"aws": cloud.url}) == "aws"


def test_detect_provider_nothing_listening_is_none_and_fast():
    url = _closed_port_url()
    started = time.monotonic()
    assert detect_provider({p: url for p in PROVIDERS}) is None
    assert time.monotonic() - started < 1.0


def test_detect_provider_ignores_a_captive_portal(cloud):
    cloud.portal = True
    assert detect_provider({p: cloud.url for p in PROVIDERS}) is None


def test_detect_provider_is_bounded_when_a_service_hangs():
    with socket.socket() as sock:  # accepts connections (backlog) but never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        started = time.monotonic()
        assert detect_provider({p: url for p in PROVIDERS}, timeout_s=0.2) is None
        assert time.monotonic() - started < 1.0


def test_detect_provider_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown cloud provider 'oci'"):
        detect_provider({"oci": "http://127.0.0.1:1"})


def test_resolve_provider(cloud):
    cloud.providers = {"azure"}
    assert resolve_provider("none") is None
    assert resolve_provider("gcp") == "gcp"
    assert resolve_provider("auto", {p: cloud.url for p in PROVIDERS}) == "azure"
    with pytest.raises(ValueError, match="unknown cloud provider 'oracle'"):
        resolve_provider("oracle")
