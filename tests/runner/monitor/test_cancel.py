"""The cancel mark: how a run tells ``ten-runner cancel`` from a preemption."""

from __future__ import annotations

from runner.monitor.cancel import MARK, announce, cancelled_since
from runner.monitor.cost import cost_summary
from runner.monitor.events import EventKind
from runner.monitor.source import RunFiles


def test_a_mark_from_this_session_says_cancelled_and_an_older_one_does_not(tmp_path):
    files = RunFiles.in_dir(tmp_path)
    assert not cancelled_since(files, started=100.0)  # no mark
    announce(files, "job-1", now=90.0)  # an earlier submission of the same job
    assert not cancelled_since(files, started=100.0)
    announce(files, "job-2", now=130.0)
    assert cancelled_since(files, started=100.0)
    for junk in (b"", b"[]", b'{"time": "soon"}', b'{"time": true}', b"{not json"):
        (tmp_path / MARK).write_bytes(junk)
        assert not cancelled_since(files, started=100.0), junk


def test_a_mark_in_a_bucket_is_read_where_the_run_is(store_url):
    from runner.storage import open_store

    store = open_store(*store_url)
    files = RunFiles("bucket", store=store, job="j")
    announce(files, "job-1", now=200.0)
    assert store.get_bytes(f"j/{MARK}") is not None
    assert cancelled_since(files, started=150.0)


def test_a_resume_after_a_cancel_is_not_counted_as_a_preemption():
    events = [{"kind": EventKind.START, "time": 0.0},
              {"kind": EventKind.STOP, "time": 50.0, "state": "cancelled", "reason": "SIGTERM"},
              {"kind": EventKind.START, "time": 100.0},
              {"kind": EventKind.RESUME, "time": 101.0, "lost_steps": 3, "lost_tokens": 30}]
    summary = cost_summary([], events, None, 1, now=150.0)
    assert summary["preemptions"] == 0 and summary["user_stops"] == 1
