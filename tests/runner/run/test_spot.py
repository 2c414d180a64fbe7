"""The run's side of spot preemption (runner.run.spot.SpotWatch), in-process against a
local stand-in for the AWS metadata service: a notice becomes the process's stop
request, and what the run says about the notice window it says once. The whole run
stopped by a notice: tests/e2e/test_run.py."""

import threading

import pytest
from runhelpers import FakeIMDS, write_job

from runner.job import load_job
from runner.monitor.events import EventKind
from runner.run.spot import SpotWatch
from ten.train.stop import Stop


class Events:
    def __init__(self):
        self.seen = []
        self.arrived = threading.Event()

    def event(self, kind, **fields):
        self.seen.append((kind, fields))
        self.arrived.set()


@pytest.fixture
def imds():
    server = FakeIMDS()
    yield server
    server.close()


def spot_job(tmp_path, corpus, imds, notice="aws", spot="true"):
    job = write_job(tmp_path, corpus)
    job.write_text(job.read_text() + f"resources:\n  spot: {spot}\n  spot_notice: {notice}\n"
                   f"  metadata_endpoint: {imds.url}\n  notice_poll_s: 0.05\n")
    return load_job(job)


def test_a_notice_is_a_stop_request_and_an_event(tmp_path, corpus, imds):
    stop, log, heartbeat = Stop(), [], Events()
    spot = SpotWatch.start(spot_job(tmp_path, corpus, imds), stop, log.append, heartbeat)
    try:
        assert "watching for aws preemption notices every 0.05 s" in log[-1]
        assert stop.reason is None
        imds.notice = True
        assert heartbeat.arrived.wait(30)
    finally:
        spot.close()
    assert stop.reason == "aws preemption notice"
    assert heartbeat.seen[0][0] is EventKind.PREEMPTION_NOTICE
    spot.report_deadline(committed_at=spot.watcher.notice.received_at)
    assert "before the deadline" in log[-1]


def test_what_cannot_fit_the_notice_window_is_said_once(tmp_path, corpus, imds):
    log = []
    spot = SpotWatch.start(spot_job(tmp_path, corpus, imds), Stop(), log.append)
    spot.close()
    del log[:]
    spot.first_commit(save_s=10.0, upload_s=None)  # the upload not measured yet: nothing
    assert log == []
    spot.first_step(step_s=300.0)
    spot.first_step(step_s=300.0)
    spot.first_commit(save_s=200.0, upload_s=30.0)
    spot.first_commit(save_s=200.0, upload_s=30.0)
    assert len(log) == 2, log
    assert "one optimizer step takes 300 s" in log[0]
    assert "last checkpoint upload took 230 s" in log[1]


@pytest.mark.parametrize("notice,spot", [("none", "true"), ("auto", "false")])
def test_without_a_watched_notice_the_run_is_told_nothing(tmp_path, corpus, imds, notice,
                                                          spot):
    log = []
    spot_watch = SpotWatch.start(spot_job(tmp_path, corpus, imds, notice, spot), Stop(),
                                 log.append)
    imds.notice = True
    spot_watch.first_step(step_s=1e6)
    spot_watch.first_commit(save_s=1e6, upload_s=1e6)
    spot_watch.report_deadline(committed_at=0.0)
    spot_watch.close()
    assert spot_watch.watcher is None and log == []
