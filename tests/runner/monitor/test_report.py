"""The report: a PNG with the expected series and an HTML page embedding it with the cost
table, from a run directory and from a store."""

import base64
import itertools
import json
import math

import pytest
from monitor_tables import gpu_run, preempted_twice

from runner.errors import UserError
from runner.monitor.cost import cost_summary
from runner.monitor.report import preemption_marks, render_png, sessions, write_report
from runner.storage import open_store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def jsonl(records):
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def recorded_run(with_gpu=True):
    metrics, events, (t2, t3) = preempted_twice()
    evals = [{"kind": "eval", "step": s, "time": r["time"] + 1, "loss": r["loss"] + 0.1,
              "perplexity": 2.0} for r in metrics if r["kind"] == "train"
             for s in [r["step"]] if s % 100 == 0]
    metrics = sorted(metrics + evals, key=lambda r: r["time"])
    gpu = []
    if with_gpu:
        first = metrics[0]["time"]
        for t in (first, t2 + 100, t3 + 100):
            gpu += gpu_run(t0=t, n=100, every_s=10.0)
    return metrics, events, gpu


def test_png_has_the_expected_series(tmp_path):
    metrics, events, gpu = recorded_run()
    drawn = render_png(metrics, events, gpu, tmp_path / "r.png", title="preempted-twice")
    n_train = sum(r["kind"] == "train" for r in metrics)
    assert drawn == {"panels": 6, "train loss by step": n_train, "eval loss by step": 10,
                     "lr by step": n_train,
                     "sessions": 3, "train loss": n_train, "eval loss": 10,
                     "tokens/s": n_train, "MFU %": n_train, "data wait %": n_train,
                     "checkpoint %": n_train, "GPU util %": 300, "GPU memory %": 300,
                     "power W": 300, "preemptions": 4}
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG_MAGIC
    labels = [label for _, label in preemption_marks(events, metrics)]
    assert labels == ["preemption notice", "resume @200: lost 60 steps",
                      "preemption notice", "resume @500: lost 30 steps"]


def test_a_run_without_gpu_samples_has_no_empty_gpu_panel(tmp_path):
    metrics, events, _ = recorded_run(with_gpu=False)
    drawn = render_png(metrics, events, [], tmp_path / "cpu.png")
    assert drawn["panels"] == 5 and drawn["GPU util %"] == 0 and drawn["train loss"] > 0


def test_the_step_panel_draws_each_session_from_where_it_resumed():
    """A resume replays the steps lost since the last checkpoint: by step, each session
    is its own line from its first step, not one line jumping back."""
    metrics, _, _ = recorded_run(with_gpu=False)
    steps = [[r["step"] for r in s if r["kind"] == "train"] for s in sessions(metrics)]
    assert [(s[0], s[-1]) for s in steps] == [(10, 260), (210, 530), (510, 1000)]
    assert all(a < b for s in steps for a, b in itertools.pairwise(s))


def test_the_headline_says_what_was_trained_on_what_and_how_it_ended():
    from runner.monitor.report import headline

    metrics = [{"kind": "start", "step": 0, "params": 1_353_728},
               {"kind": "eval", "step": 100, "loss": 6.1, "perplexity": 445.9},
               {"kind": "eval", "step": 300, "loss": 5.6526, "perplexity": 285.04,
                "recall_repeat": 0.031}]
    resolved = {"model": {"arch": "ten", "preset": "tiny"},
                "data": {"dataset": "builtin:botocore-docs", "mode": "pretokenized"}}
    assert headline(metrics, resolved) == (
        "ten/tiny; 1.4M parameters; data builtin:botocore-docs (pretokenized); held-out "
        "loss 5.6526, perplexity 285.04, recall 3.1% at step 300")
    assert headline([], None) == "no model or evaluation recorded"


@pytest.mark.parametrize("where", ["run_dir", "store"])
def test_write_report_from_a_run_directory_or_a_store(tmp_path, where):
    metrics, events, gpu = recorded_run()
    status = {"job": "big", "state": "done", "step": 1000, "diagnoses": [
        {"code": "thermal", "severity": "warning", "message": "thermal throttling <since>"}],
        "cost": {"price_per_hour": 0.90}}
    files = {"metrics.jsonl": jsonl(metrics), "events.jsonl": jsonl(events),
             "gpu.jsonl": jsonl(gpu), "status.json": json.dumps(status).encode()}
    if where == "run_dir":
        run = tmp_path / "runs" / "big"
        run.mkdir(parents=True)
        for name, data in files.items():
            (run / name).write_bytes(data)
        png, page = write_report(str(run), None, tmp_path / "out")
    else:
        store = open_store(str(tmp_path / "store"))
        for name, data in files.items():
            store.put_bytes(f"big/{name}", data)
        png, page = write_report(str(tmp_path / "store"), "big", tmp_path / "out")
    assert png.name == "big-report.png" and png.read_bytes()[:8] == PNG_MAGIC
    html = page.read_text()
    assert base64.b64encode(png.read_bytes()).decode() in html
    assert "<th>GPU-hours paid</th><td>0.99</td>" in html
    assert "<th>$ per 1B tokens</th><td>$216.74</td>" in html
    assert "90 steps, 368,640 tokens" in html
    assert "thermal throttling &lt;since&gt;" in html  # escaped
    assert html.count("<td>resume</td>") == 2


def test_report_without_metrics_is_a_user_error(tmp_path):
    (tmp_path / "store" / "j").mkdir(parents=True)
    (tmp_path / "store" / "j" / "status.json").write_text("{}")
    with pytest.raises(UserError, match="no metrics for"):
        write_report(str(tmp_path / "store"), "j", tmp_path / "out")


def test_report_of_a_cpu_run_stopped_with_ctrl_c(tmp_path):
    from monitor_tables import T0, train_run

    first = train_run(steps=range(10, 110, 10), t0=T0 + 10)
    second = train_run(steps=range(110, 210, 10), t0=T0 + 1000, start_step=100, resumed=True)
    for r in first + second:
        r.pop("peak_mem_gb", None)
        if r["kind"] == "start":
            r["device"] = "cpu"
    events = [{"kind": "start", "time": T0},
              {"kind": "stop", "time": T0 + 400, "state": "stopped", "reason": "SIGINT"},
              {"kind": "start", "time": T0 + 990},
              {"kind": "resume", "time": T0 + 995, "from_step": 100, "reached_step": 100,
               "lost_steps": 0, "lost_tokens": 0}]
    run = tmp_path / "runs" / "laptop"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_bytes(jsonl(first + second))
    (run / "events.jsonl").write_bytes(jsonl(events))
    _, page = write_report(str(run), None, tmp_path / "out")
    html = page.read_text()
    assert "GPU-hours" not in html and "<th>machine-hours paid (CPU)</th>" in html
    assert "<th>preemptions</th><td>0</td>" in html
    assert "<th>stopped by the user</th><td>1</td>" in html
    assert [label for _, label in preemption_marks(events, first + second)] == \
        ["resume @100 after a user stop: lost 0 steps"]


def test_eval_loss_is_in_the_step_panels_legend_when_the_first_session_had_none():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from runner.monitor.report import _by_step

    first = [{"kind": "start", "step": 0, "time": 0.0},
             {"kind": "train", "step": 10, "time": 1.0, "loss": 5.0}]
    second = [{"kind": "start", "step": 10, "time": 5.0, "resumed": True},
              {"kind": "train", "step": 20, "time": 6.0, "loss": 4.0},
              {"kind": "eval", "step": 20, "time": 7.0, "loss": 4.5}]
    fig, ax = plt.subplots()
    _by_step(ax, first + second, {})
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train loss", "eval loss"]
    plt.close(fig)


def test_wall_clock_lines_break_where_a_session_began():
    """kill -9 and a rerun 20 s later: the loss line was drawn straight across the gap."""
    from runner.monitor.report import wall_series

    records = [{"kind": "train", "time": t, "loss": 1.0} for t in (0, 10, 20, 30, 50, 60)]
    xs, ys = wall_series(records, "train", "loss", 0.0, unit_s=1.0, breaks=[0.0, 45.0])
    assert [math.isnan(y) for y in ys] == [False] * 4 + [True] + [False] * 2
    assert xs[4] == 40.0


def test_a_long_title_is_wrapped_to_the_figures_width():
    from runner.monitor.report import TITLE_CHARS, figure_title

    title = "pydocs-txt: " + "; ".join(["ten/small_32k", "39.2M parameters",
                                        "data /home/someone/corpora/python-docs/*.txt (full)",
                                        "held-out loss 2.0712, perplexity 7.93, recall 3.1% "
                                        "at step 200"])
    lines = figure_title(title, 0.0).splitlines()
    assert len(lines) == 3 and all(len(line) <= TITLE_CHARS for line in lines)
    assert lines[-1] == "1970-01-01 00:00 UTC" and " ".join(lines[:-1]) == title


def test_the_pages_events_are_in_time_order_with_rounded_numbers(tmp_path):
    from runner.monitor.report import render_html

    png = tmp_path / "r.png"
    png.write_bytes(PNG_MAGIC)
    events = [{"kind": "checkpoint", "time": 200.0, "step": 8, "seconds": 0.25768904999995357},
              {"kind": "start", "time": 100.0, "host": "h"}]
    page = render_html({"job": "j", "label": "runs/j", "metrics": [], "events": events},
                       cost_summary([], events, None), png)
    assert page.index(">start<") < page.index(">checkpoint<")
    assert "seconds=0.258" in page and "0.2576" not in page
