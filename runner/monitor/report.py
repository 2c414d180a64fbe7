"""``ten-runner report JOB``: one PNG and one self-contained HTML page per run.

The first panel is loss and held-out loss by step, each session (a start of the trainer)
its own line, so a resume that replays lost steps is drawn as such, not as a zigzag; the
second, the learning rate by step (where a changed budget bends the schedule). The
panels below share a wall-clock axis (minutes or hours since the first start) so
preemptions line up across them: loss and held-out loss; tokens/s and MFU; data-wait and
checkpoint share of wall time; GPU utilisation, memory and power (no panel when no GPU
was sampled); their lines break where a session began. Red lines mark preemptions and
resumes with the work they lost (a resume after the user's Ctrl-C, a larger budget or a
failure says so). The HTML embeds the PNG (base64) and the cost summary:
GPU-hours paid (machine-hours for a CPU run), goodput, $ per 1B tokens.

The run is a run directory, a store and a job, or a bucket run (s3://bucket/prefix/JOB).

matplotlib is imported inside :func:`render_png` with the Agg backend (no display).
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import textwrap
import time
from pathlib import Path
from typing import Any

from runner.monitor.cost import cost_summary, format_cost
from runner.monitor.events import EventKind
from runner.monitor.source import open_run
from runner.storage.mirror import EVENTS_FILE, GPU, METRICS, STATUS
from ten.train.metrics import MetricKind

TITLE_CHARS = 110  # a title line's width that fits the figure (11 in at 10 pt)
EVENT_ROWS = 200  # the page lists the newest events


def load_run(store_or_path: str, job: str | None = None,
             endpoint_url: str | None = None) -> dict[str, Any]:
    """Everything a report needs from a run directory or ``<store>/<job>/``."""
    run = open_run(store_or_path, job, endpoint_url)
    return {"label": run.label, "job": job or run.job or Path(run.label).name,
            "local_dir": run.local_dir,
            "metrics": run.read_jsonl(METRICS),
            "events": run.read_jsonl(EVENTS_FILE),
            "gpu": run.read_jsonl(GPU),
            "status": run.read_json(STATUS),
            "resolved": run.read_json("job.json")}


REPORTS = "reports"  # the folder a report goes in: in its run directory, or here


def write_report(store_or_path: str, job: str | None, out_dir: Path | str | None = None,
                 endpoint_url: str | None = None, price_per_hour: float | None = None,
                 gpus: int = 1, scrub: Any = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<job>-report.png`` and ``.html``; returns both paths.
    ``out_dir`` defaults to ``reports/`` in the run's directory, or in the current one
    for a run in a bucket. ``price_per_hour`` defaults to the one the heartbeat
    recorded; ``scrub`` (a job file's) rewrites the page (it names where the run was
    read from)."""
    from runner.errors import UserError
    from runner.exit_codes import ExitCode

    run = load_run(store_or_path, job, endpoint_url)
    if not run["metrics"]:
        raise UserError(f"no metrics for {run['label']} yet: nothing to report",
                        exit_code=ExitCode.CONFIG)
    if price_per_hour is None:
        price_per_hour = ((run["status"] or {}).get("cost") or {}).get("price_per_hour")
    summary = cost_summary(run["metrics"], run["events"], price_per_hour, gpus)
    out = Path(out_dir) if out_dir is not None else (run["local_dir"] or Path(".")) / REPORTS
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{run['job']}-report.png"
    render_png(run["metrics"], run["events"], run["gpu"], png,
               title=f"{run['job']}: {headline(run['metrics'], run['resolved'])}")
    page = out / f"{run['job']}-report.html"
    text = render_html(run, summary, png)
    page.write_text(scrub(text) if scrub else text, encoding="utf-8")
    return png, page


def headline(metrics: list[dict[str, Any]], resolved: dict[str, Any] | None) -> str:
    """What was trained on what, and how it ended: the model, its size, the data, and the
    last held-out loss, perplexity and recall (what a reader of the report asks first)."""
    parts = []
    model, data = (resolved or {}).get("model") or {}, (resolved or {}).get("data") or {}
    if model:
        parts.append(f"{model.get('arch', '?')}/{model.get('preset', '?')}")
    starts = [r for r in metrics if r.get("kind") == MetricKind.START and r.get("params")]
    if starts:
        parts.append(f"{starts[-1]['params'] / 1e6:,.1f}M parameters")
    if data:
        parts.append(f"data {data.get('dataset', '?')} ({data.get('mode', '?')})")
    evals = [r for r in metrics if r.get("kind") == MetricKind.EVAL and "loss" in r]
    if evals:
        last = evals[-1]
        said = f"held-out loss {last['loss']:.4f}"
        if last.get("perplexity") is not None:
            said += f", perplexity {last['perplexity']:,.2f}"
        if last.get("recall_repeat") is not None:
            said += f", recall {100 * last['recall_repeat']:.1f}%"
        parts.append(f"{said} at step {last.get('step', '?')}")
    return "; ".join(parts) or "no model or evaluation recorded"


def wall_series(records: list[dict[str, Any]], kind: MetricKind | None, key: str,
                t0: float, scale: float = 1.0, unit_s: float = 3600.0,
                breaks: list[float] = ()) -> tuple[list[float], list[float]]:
    """(time since t0 in ``unit_s``, value) of ``key`` in records of ``kind`` (kind
    None: any), with a NaN breaking the line wherever the run was down: at each of
    ``breaks`` (the unix times sessions started, so a kill -9 and a quick rerun is no
    straight line across), and at a gap over 5x the usual spacing and over 5 minutes;
    nothing is drawn for time nobody trained."""
    pts = sorted(((r["time"] - t0) / unit_s, float(r[key]) * scale) for r in records
                 if (kind is None or r.get("kind") == kind) and r.get(key) is not None
                 and r.get("time") is not None)
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(pts))
    limit = max(5 * gaps[len(gaps) // 2], 300 / unit_s) if gaps else math.inf
    starts = [(b - t0) / unit_s for b in breaks]
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y) in enumerate(pts):
        before = pts[i - 1][0] if i else None
        if before is not None and (x - before > limit
                                   or any(before < b <= x for b in starts)):
            xs.append((x + before) / 2)
            ys.append(math.nan)
        xs.append(x)
        ys.append(y)
    return xs, ys


def _gpu_panel(ax: Any, gpu: list[dict[str, Any]], series: Any, plot: Any,
               drawn: dict[str, int], t0: float) -> None:
    """Utilisation and memory (%), power (W) on a twin axis."""
    plot(ax, *series(gpu, None, "util", t0), "GPU util %", color="tab:green")
    mem = [dict(s, mem_pct=100.0 * s["mem_used"] / s["mem_total"]) for s in gpu
           if s.get("mem_used") is not None and s.get("mem_total")]
    plot(ax, *series(mem, None, "mem_pct", t0), "GPU memory %", color="tab:blue")
    ax.set_ylim(0, 105)
    ax.set_ylabel("%")
    twin = ax.twinx()
    plot(twin, *series(gpu, None, "power_w", t0), "power W", color="tab:orange", alpha=0.7)
    twin.set_ylabel("W")
    watts = [s.get("power_limit_w") or s.get("power_w") or 0.0 for s in gpu]
    twin.set_ylim(0, 1.05 * max(watts + [1.0]))
    _legend(ax, twin)


def _mark_preemptions(axes: Any, marks: list[tuple[float, str]], t0: float,
                      unit_s: float) -> None:
    """A red dotted line on every panel at each preemption/resume, labelled on the top."""
    for t, label in marks:
        x = (t - t0) / unit_s
        for a in axes:
            a.axvline(x, color="red", linestyle=":", linewidth=1.2)
        axes[0].annotate(label, (x, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=8, color="red")


def figure_title(title: str, t0: float) -> str:
    """The title wrapped to lines the figure's width holds, then the start time."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
    return "\n".join([*textwrap.wrap(title, TITLE_CHARS), when])


def render_png(metrics: list[dict[str, Any]], events: list[dict[str, Any]],
               gpu: list[dict[str, Any]], path: Path, title: str = "") -> dict[str, int]:
    """Draw the panels into ``path``; returns the number of points per series drawn
    (what the tests check)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    times = [x["time"] for x in [*metrics, *events, *gpu] if x.get("time") is not None]
    t0 = min(times) if times else 0.0
    span = (max(times) - t0) if times else 0.0
    unit_s, unit = (60.0, "minutes") if span < 7200 else (3600.0, "hours")
    drawn: dict[str, int] = {"panels": 6 if gpu else 5}  # no empty GPU panel on a CPU run
    fig, panels = plt.subplots(drawn["panels"], 1, figsize=(11, 3.25 * drawn["panels"] + 0.5),
                               layout="constrained")  # room for a title of any height
    fig.suptitle(figure_title(title, t0), fontsize=10)
    _by_step(panels[0], metrics, drawn)
    _lr_by_step(panels[1], metrics, drawn)
    axes = panels[2:]  # on the wall clock
    for a in axes[1:]:
        a.sharex(axes[0])
    starts = [r["time"] for r in metrics
              if r.get("kind") == MetricKind.START and r.get("time") is not None]

    def series(*args, **kw):  # on this figure's time unit, broken where a session began
        return wall_series(*args, unit_s=unit_s, breaks=starts, **kw)

    def plot(ax, xs, ys, name, **kw):
        drawn[name] = sum(1 for y in ys if not math.isnan(y))
        if xs:
            ax.plot(xs, ys, label=name, **kw)

    ax = axes[0]
    plot(ax, *series(metrics, MetricKind.TRAIN, "loss", t0), "train loss", color="tab:blue")
    plot(ax, *series(metrics, MetricKind.EVAL, "loss", t0), "eval loss", color="tab:orange",
         marker="o", linestyle="--")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right")

    ax = axes[1]
    plot(ax, *series(metrics, MetricKind.TRAIN, "tokens_per_s", t0), "tokens/s", color="tab:green")
    ax.set_ylabel("tokens/s")
    twin = ax.twinx()
    plot(twin, *series(metrics, MetricKind.TRAIN, "mfu", t0, 100.0), "MFU %", color="tab:purple")
    twin.set_ylabel("MFU %")
    ax.set_ylim(bottom=0)  # from zero: a 3% wobble should look like one
    twin.set_ylim(bottom=0)
    if not drawn["MFU %"]:  # a CPU has no peak to measure against: no empty axis
        twin.axis("off")
    _legend(ax, twin)

    ax = axes[2]
    plot(ax, *series(metrics, "train", "data_wait_frac", t0, 100.0), "data wait %",
         color="tab:red")
    plot(ax, *series(metrics, "train", "checkpoint_frac", t0, 100.0), "checkpoint %",
         color="tab:brown")
    ax.set_ylabel("% of wall time")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper right")

    if gpu:
        _gpu_panel(axes[3], gpu, series, plot, drawn, t0)
    else:
        drawn["GPU util %"] = 0
    for a in axes[:-1]:
        a.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"{unit} since start")
    marks = preemption_marks(events, metrics)
    drawn["preemptions"] = len(marks)
    _mark_preemptions(axes, marks, t0, unit_s)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return drawn


def sessions(metrics: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records of each session of the trainer, in the order written: a start record
    begins one (metrics.jsonl holds every session's, one after the other)."""
    out: list[list[dict[str, Any]]] = []
    for r in metrics:
        if r.get("kind") == MetricKind.START or not out:
            out.append([])
        out[-1].append(r)
    return out


def _by_step(ax: Any, metrics: list[dict[str, Any]], drawn: dict[str, int]) -> None:
    """Loss and held-out loss against the step, one line per session; a dotted line
    where a session resumed (its first step), so replayed steps show as a new line."""
    drawn["sessions"] = 0
    _per_session(ax, metrics, drawn, (
        (MetricKind.TRAIN, "loss", "train loss by step", {"color": "tab:blue"}),
        (MetricKind.EVAL, "loss", "eval loss by step",
         {"color": "tab:orange", "marker": "o", "linestyle": "--"})))
    resumed: list[tuple[float, str]] = []
    for session in sessions(metrics):
        start = session[0]
        if start.get("kind") == MetricKind.START:
            drawn["sessions"] += 1
            if start.get("resumed") and start.get("step") is not None:
                resumed.append((start["step"], f"resumed @{start['step']}"))
    _mark_preemptions([ax], resumed, 0.0, 1.0)  # at the step itself
    ax.set_ylabel("loss")


def _lr_by_step(ax: Any, metrics: list[dict[str, Any]], drawn: dict[str, int]) -> None:
    """The learning rate each logged step used, one line per session: a budget or
    schedule changed at a resume shows where it bends."""
    _per_session(ax, metrics, drawn, (
        (MetricKind.TRAIN, "lr", "lr by step", {"color": "tab:gray"}),))
    ax.set_ylabel("learning rate")
    ax.set_ylim(bottom=0)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))


def _per_session(ax: Any, metrics: list[dict[str, Any]], drawn: dict[str, int],
                 lines: tuple[tuple[MetricKind, str, str, dict[str, Any]], ...]) -> None:
    """``key`` of records of ``kind`` against the step, one line per session; each
    series is named in the legend once, by its first line drawn."""
    for kind, key, name, style in lines:
        drawn[name] = 0
        for session in sessions(metrics):
            pts = [(r["step"], r[key]) for r in session if r.get("kind") == kind
                   and r.get("step") is not None and r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True),
                        label=None if drawn[name] else name.split(" by")[0], **style)
                drawn[name] += len(pts)
    ax.set_xlabel("step")
    if any(drawn[name] for _, _, name, _ in lines):
        ax.legend(loc="upper right")


def preemption_marks(events: list[dict[str, Any]],
                     metrics: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(time, label) for each resume (with its lost work) and preemption notice; a
    resume after the user stopped the run (Ctrl-C) is labelled as such."""
    from runner.monitor.cost import ResumeCause, lost_from_metrics, resume_cause

    why_by_cause = {ResumeCause.USER: " after a user stop",
                    ResumeCause.EXTENDED: " with a larger budget",
                    ResumeCause.FAILED: " after a failure", ResumeCause.PREEMPTED: ""}
    marks = []
    resumes = [e for e in events if e.get("kind") == EventKind.RESUME] \
        or lost_from_metrics(metrics)
    for e in resumes:
        if e.get("time") is not None:
            why = why_by_cause[resume_cause(e, events)]
            marks.append((e["time"], f"resume @{e.get('from_step')}{why}: lost "
                                      f"{e.get('lost_steps') or 0} steps"))
    for e in events:
        if e.get("kind") == EventKind.PREEMPTION_NOTICE and e.get("time"):
            marks.append((e["time"], "preemption notice"))
    return sorted(marks)


def render_html(run: dict[str, Any], summary: dict[str, Any], png: Path) -> str:
    image = base64.b64encode(png.read_bytes()).decode()
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in format_cost(summary))
    status = run.get("status") or {}
    diag = "".join(f"<li><b>{html.escape(d.get('severity', ''))}</b> "
                   f"{html.escape(d.get('message', ''))}</li>"
                   for d in status.get("diagnoses") or ())
    events = "".join(
        f"<tr><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(e['time']))}</td>"
        f"<td>{html.escape(str(e.get('kind')))}</td><td>{html.escape(_fields(e))}</td></tr>"
        for e in sorted((e for e in run["events"] if isinstance(e.get("time"), (int, float))),
                        key=lambda e: e["time"])[-EVENT_ROWS:])
    state = html.escape(str(status.get("state", "unknown")))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(run['job'])} report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left}}</style></head>
<body><h1>{html.escape(run['job'])}</h1>
<p>{html.escape(headline(run['metrics'], run.get('resolved')))}</p>
<p>source {html.escape(run['label'])} — state {state}, step {status.get('step', '-')}</p>
<h2>Cost</h2><table>{rows}</table>
<h2>Diagnoses</h2><ul>{diag or '<li>none</li>'}</ul>
<h2>Curves</h2><img alt="training curves" src="data:image/png;base64,{image}">
<h2>Events</h2><table><tr><th>time (UTC)</th><th>kind</th><th>details</th></tr>{events}
</table></body></html>
"""


def _fields(e: dict[str, Any]) -> str:
    """An event's details as ``key=value``, numbers to three decimals at most."""
    def show(v: Any) -> str:
        if isinstance(v, float) and math.isfinite(v):
            return f"{v:,.3f}".rstrip("0").rstrip(".")
        return str(v)

    return ", ".join(f"{k}={show(v)}" for k, v in e.items() if k not in ("kind", "time"))


def _legend(ax, twin) -> None:
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    if h1 or h2:
        ax.legend(h1 + h2, l1 + l2, loc="lower right")
