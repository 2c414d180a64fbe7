"""Cost, lost work and goodput from a recorded run preempted twice."""

import pytest
from monitor_tables import T0, TOKENS_PER_STEP, preempted_twice, train_run

from runner.monitor.cost import (
    cost_summary,
    format_cost,
    goodput,
    lost_from_metrics,
    lost_work,
    sessions,
)


@pytest.mark.parametrize("reached, resumed, per_step, expected", [
    (260, 200, 4096, (60, 60 * 4096)),
    (200, 200, 4096, (0, 0)),  # preempted right after a checkpoint: nothing lost
    (None, 200, 4096, (0, 0)),  # first start, or nothing known
    (150, 200, 4096, (0, 0)),  # restored a newer checkpoint than seen: never negative
    (530, 500, None, (30, None)),
])
def test_lost_work(reached, resumed, per_step, expected):
    assert lost_work(reached, resumed, per_step) == expected


def test_sessions_span_start_to_last_record():
    metrics, events, (t2, t3) = preempted_twice()
    spans = sessions(events, metrics)
    assert [round(s) for s, _ in spans] == [T0, t2, t3]
    assert [round(e - s) for s, e in spans] == [870, 1080, 1601]
    live = sessions(events[:4], metrics[:40], now=t2 + 500)  # session 2 still running
    assert live[-1] == (t2, t2 + 500)


def test_lost_work_from_metrics_alone_matches_the_events():
    metrics, events, _ = preempted_twice()
    found = lost_from_metrics(metrics)
    assert [(r["from_step"], r["reached_step"], r["lost_steps"]) for r in found] == \
        [(200, 260, 60), (500, 530, 30)]
    with_events = cost_summary(metrics, events, 1.0)
    without = cost_summary(metrics, [e for e in events if e["kind"] != "resume"], 1.0)
    assert with_events["lost_tokens"] == without["lost_tokens"] == 90 * TOKENS_PER_STEP


def test_cost_summary_of_a_run_preempted_twice():
    metrics, events, _ = preempted_twice()
    s = cost_summary(metrics, events, price_per_hour=0.90, gpus=1)
    paid = 870 + 1080 + 1601
    assert s["sessions"] == 3 and s["preemptions"] == 2
    assert s["paid_seconds"] == pytest.approx(paid)
    assert s["compute_hours"] == pytest.approx(paid / 3600)
    assert s["cost_usd"] == pytest.approx(0.90 * paid / 3600)
    assert s["useful_tokens"] == 1000 * TOKENS_PER_STEP
    assert s["processed_tokens"] == 1090 * TOKENS_PER_STEP
    assert s["lost_steps"] == 90
    assert s["goodput_tokens_per_compute_s"] == pytest.approx(1000 * TOKENS_PER_STEP / paid)
    assert s["usd_per_1b_tokens"] == pytest.approx(0.90 * paid / 3600 / (4_096_000 / 1e9))
    rows = dict(format_cost(s))
    assert rows["lost (redone) work"] == "90 steps, 368,640 tokens"
    assert rows["$ per 1B tokens"] == "$216.74"


def test_two_gpus_double_the_gpu_seconds_not_the_price():
    metrics, events, _ = preempted_twice()
    one, two = cost_summary(metrics, events, 2.0, 1), cost_summary(metrics, events, 2.0, 2)
    assert two["compute_hours"] == pytest.approx(2 * one["compute_hours"])
    assert two["cost_usd"] == one["cost_usd"]
    goodput = "goodput_tokens_per_compute_s"
    assert two[goodput] == pytest.approx(one[goodput] / 2)


def test_no_price_no_dollars_and_nothing_paid_no_goodput():
    s = cost_summary(train_run(), [], None)
    assert s["cost_usd"] is None and s["usd_per_1b_tokens"] is None
    assert s["sessions"] == 1 and s["goodput_tokens_per_compute_s"] > 0
    assert goodput(100, 0.0) is None
    empty = cost_summary([], [], 1.0)
    assert empty["paid_seconds"] == 0 and empty["cost_usd"] == 0


def cpu_run(**kw):
    records = train_run(**kw)
    records[0]["device"] = "cpu"
    return records


def test_a_cpu_run_pays_machine_hours_not_gpu_hours():
    metrics = cpu_run()
    s = cost_summary(metrics, [], 0.10, gpus=2)  # no GPU to multiply by
    paid = metrics[-1]["time"] - metrics[0]["time"]
    assert s["compute"] == "CPU" and s["compute_hours"] == pytest.approx(paid / 3600)
    assert not any("gpu" in key for key in s)  # status.json said gpu_hours on a CPU run
    rows = dict(format_cost(s))
    assert "GPU-hours paid" not in rows
    assert rows["machine-hours paid (CPU)"] == f"{paid / 3600:.2f}"
    assert rows["goodput"].endswith("tokens / machine-s")
    assert dict(format_cost(cost_summary(train_run(), [], 1.0)))["goodput"].endswith("GPU-s")


def test_ctrl_c_then_run_again_is_not_a_preemption():
    first = train_run(steps=range(10, 110, 10), t0=T0 + 10)
    second = train_run(steps=range(110, 210, 10), t0=T0 + 1000, start_step=100, resumed=True)
    user = [{"kind": "start", "time": T0},
            {"kind": "stop", "time": T0 + 400, "state": "stopped", "reason": "SIGINT",
             "exit_code": 75},
            {"kind": "start", "time": T0 + 990},
            {"kind": "resume", "time": T0 + 995, "from_step": 100, "reached_step": 100,
             "lost_steps": 0, "lost_tokens": 0}]
    s = cost_summary(first + second, user, 1.0)
    assert (s["preemptions"], s["user_stops"], s["sessions"]) == (0, 1, 2)
    assert dict(format_cost(s))["stopped by the user"] == "1"
    # The same history ended by SIGTERM (a spot reclaim) is a preemption.
    spot = [dict(e, state="preempted", reason="SIGTERM") if e["kind"] == "stop" else e
            for e in user]
    s = cost_summary(first + second, spot, 1.0)
    assert (s["preemptions"], s["user_stops"]) == (1, 0)
    assert "stopped by the user" not in dict(format_cost(s))


def test_a_kill_after_an_earlier_ctrl_c_is_still_a_preemption():
    """Ctrl-C, run again, kill -9 (no stop event), run again: one of each."""
    events = [{"kind": "start", "time": T0},
              {"kind": "stop", "time": T0 + 100, "state": "stopped", "reason": "SIGINT"},
              {"kind": "start", "time": T0 + 200},
              {"kind": "resume", "time": T0 + 205, "from_step": 10, "lost_steps": 0},
              {"kind": "start", "time": T0 + 900},
              {"kind": "resume", "time": T0 + 905, "from_step": 30, "lost_steps": 5}]
    s = cost_summary([], events, None)
    assert (s["preemptions"], s["user_stops"], s["lost_steps"]) == (1, 1, 5)


def test_stops_are_counted_by_their_cause():
    """A finished run given a larger budget was counted 'preemptions 1' (issue 44); so was
    a relaunch after a failure. Each cause has its own count and row."""
    def history(state, exit_code):
        return [{"kind": "start", "time": T0},
                {"kind": "stop", "time": T0 + 100, "state": state, "exit_code": exit_code},
                {"kind": "start", "time": T0 + 200},
                {"kind": "resume", "time": T0 + 205, "from_step": 200, "lost_steps": 0}]

    extended = cost_summary([], history("done", 0), None)
    assert (extended["preemptions"], extended["extensions"]) == (0, 1)
    assert dict(format_cost(extended))["resumed with a larger budget"] == "1"
    failed = cost_summary([], history("failed", 4), None)
    assert (failed["preemptions"], failed["failures_resumed"]) == (0, 1)
    assert dict(format_cost(failed))["resumed after a failure"] == "1"
    preempted = cost_summary([], history("preempted", 75), None)
    assert (preempted["preemptions"], preempted["extensions"],
            preempted["failures_resumed"]) == (1, 0, 0)
    assert "resumed with a larger budget" not in dict(format_cost(preempted))
