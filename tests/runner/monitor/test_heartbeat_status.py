"""The heartbeat writes status.json and events.jsonl to the run directory and the store;
``read_statuses`` reads them back from a local store and an S3 server (moto)."""

import json
import time

import pytest
from monitor_tables import TOKENS_PER_STEP, gpu_run, train_run

from runner.errors import UserError
from runner.monitor.events import EventKind
from runner.monitor.heartbeat import Heartbeat, build_status, read_jsonl
from runner.monitor.status import format_status_table, is_stale, read_statuses
from runner.storage import open_store


class FakeSampler:
    def __init__(self, samples):
        self.samples = samples

    def snapshot(self):
        return list(self.samples)


def write_metrics(run_dir, records, mode="w"):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", mode) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def recent_run(**kw):
    """A run recorded over the last 15 minutes (diagnoses look at the clock)."""
    t0 = time.time() - 900
    return train_run(t0=t0, **kw), gpu_run(t0=t0)


def wait_for(predicate, timeout=10.0):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_heartbeat_round_trip_through_a_store(tmp_path, store_url):
    url, endpoint = store_url
    store = open_store(url, endpoint)
    run_dir = tmp_path / "work" / "tiny"
    records, samples = recent_run(data_wait=0.38)
    write_metrics(run_dir, records)
    lines = []
    hb = Heartbeat(run_dir, store, "tiny", period_s=0.05, price_per_hour=1.80,
                   sampler=FakeSampler(samples), log=lines.append,
                   started=time.time() - 1000)
    hb.start()
    wait_for(lambda: (run_dir / "status.json").exists())
    hb.checkpoint_committed(run_dir / "checkpoints" / "step-00000300", 1.5)

    def in_store():  # wait for what is asserted, however loaded the machine is
        raw = store.get_bytes("tiny/status.json")  # the local copy is written first
        events = store.get_bytes("tiny/events.jsonl") or b""
        return raw is not None and json.loads(raw)["last_checkpoint"] is not None \
            and b"checkpoint" in events

    wait_for(in_store)
    (live,) = read_statuses(url, "tiny", endpoint)
    assert live["state"] == "running" and live["step"] == 300
    assert live["tokens"] == 300 * TOKENS_PER_STEP
    assert live["last_checkpoint"]["step"] == 300
    assert live["gpu"]["util"] == 97
    assert [d["code"] for d in live["diagnoses"]] == ["data-bound", "power-cap"]
    assert live["cost"]["cost_usd"] > 0 and live["eta_s"] == pytest.approx(700 * 3.0)
    hb.stop("done")
    (done,) = read_statuses(url, None, endpoint)  # every job in the store
    assert done["job"] == "tiny" and done["state"] == "done" and done["diagnoses"] == []
    kinds = [e["kind"] for e in read_jsonl(run_dir / "events.jsonl")]
    assert kinds == ["start", "checkpoint", "stop"]
    assert store.get_bytes("tiny/gpu.jsonl").count(b"\n") == len(samples)
    assert store.get_bytes("tiny/metrics.jsonl") == (run_dir / "metrics.jsonl").read_bytes()
    assert lines == ["monitor: data-bound: 38% of step waiting for batches, GPU util 97% — "
                     "use pretokenized mode or more workers"]  # once, not every beat
    table = format_status_table([live, done], now=time.time())
    assert table.splitlines()[0].split() == ["JOB", "STATE", "STEP", "LOSS", "TOK/S", "MFU",
                                             "ETA", "COST", "AGE", "GPU"]
    assert "tiny  running  300/1000" in table and "tiny  done" in table
    assert "[warning] data-bound: 38% of step waiting for batches, GPU util 97%" in table


def test_local_run_directory_without_a_store(tmp_path):
    run_dir = tmp_path / "runs" / "cpu"
    records, _ = recent_run()
    write_metrics(run_dir, records)
    hb = Heartbeat(run_dir, None, "cpu", period_s=0.05)
    hb.start()
    hb.stop("preempted")
    for where, job in ((str(run_dir), None), (str(tmp_path / "runs"), "cpu"),
                       (str(tmp_path / "runs"), None)):
        (s,) = read_statuses(where, job)
        assert s["state"] == "preempted" and s["gpu"] is None and s["step"] == 300


def test_a_run_directory_removed_under_a_live_run_is_not_re_created(tmp_path):
    """Issue 45, fault 6: after `ten-runner rm --force` the dying run's last event and
    beat re-created the folder, with an events.jsonl and a status.json."""
    import shutil

    run_dir = tmp_path / "runs" / "gone"
    records, _ = recent_run()
    write_metrics(run_dir, records)
    said = []
    hb = Heartbeat(run_dir, None, "gone", period_s=3600.0, log=said.append)
    hb.start()
    deadline = time.monotonic() + 60
    while not (run_dir / "status.json").exists():  # the first beat, then none till stop
        assert time.monotonic() < deadline, "no first beat"
        time.sleep(0.01)
    shutil.rmtree(run_dir)
    hb.event(EventKind.STOP, state="failed")
    hb.stop("failed")
    assert not run_dir.exists()


def test_stale_heartbeat():
    now = 1_000_000.0
    s = {"job": "j", "state": "running", "time": now - 100, "period_s": 30}
    assert not is_stale(s, now)  # 100 s < max(90, 120)
    assert is_stale(s, now + 30)
    assert is_stale({**s, "period_s": 60}, now + 30) is False  # 130 < 180
    assert not is_stale({**s, "state": "done"}, now + 10_000)
    table = format_status_table([{**s, "step": 5}], now + 3600)
    assert table.splitlines()[1].split()[:3] == ["j", "stale", "5"]
    assert "j: stale — last heartbeat 62 min ago" in table


def test_resume_after_preemption_records_lost_work(tmp_path):
    run_dir = tmp_path / "r"
    first = train_run(steps=range(10, 270, 10), t0=time.time() - 3000)  # reached 260
    write_metrics(run_dir, first)
    lines = []
    hb = Heartbeat(run_dir, None, "r", period_s=0.05, log=lines.append)
    hb.start()
    second = train_run(steps=range(210, 230, 10), t0=time.time(), start_step=200,
                       resumed=True)
    write_metrics(run_dir, second, mode="a")
    wait_for(lambda: "resume" in (run_dir / "events.jsonl").read_text())
    hb.stop()
    (resume,) = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "resume"]
    assert (resume["from_step"], resume["reached_step"], resume["lost_steps"],
            resume["lost_tokens"]) == (200, 260, 60, 60 * TOKENS_PER_STEP)
    assert lines == ["resumed at step 200: 60 steps (245,760 tokens) done before the "
                     "interruption are redone"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["cost"]["lost_steps"] == 60


def test_lost_work_counts_only_the_previous_life(tmp_path):
    run_dir = tmp_path / "r"
    t = time.time() - 5000
    first = train_run(steps=range(10, 270, 10), t0=t)  # reached 260, checkpoint 200
    second = train_run(steps=range(210, 240, 10), t0=t + 2000, start_step=200,
                       resumed=True)  # preempted again at 230, before another checkpoint
    write_metrics(run_dir, first + second)
    hb = Heartbeat(run_dir, None, "r", period_s=0.05)
    hb.start()
    write_metrics(run_dir, train_run(steps=[210], t0=time.time(), start_step=200,
                                     resumed=True), mode="a")
    hb.stop()
    (resume,) = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "resume"]
    assert (resume["reached_step"], resume["lost_steps"]) == (230, 30)


def test_a_new_machine_adopts_the_history_in_the_store(tmp_path):
    store = open_store(str(tmp_path / "store"))
    old = tmp_path / "old"
    write_metrics(old, train_run(t0=time.time() - 2000))
    hb = Heartbeat(old, store, "j", period_s=0.05)
    hb.start()
    hb.stop("preempted")
    new = tmp_path / "new"  # a fresh spot instance: empty run directory
    hb = Heartbeat(new, store, "j", period_s=0.05)
    hb.start()
    hb.stop("done")
    kinds = [e["kind"] for e in read_jsonl(new / "events.jsonl")]
    assert kinds == ["start", "stop", "start", "stop"]
    assert (new / "metrics.jsonl").read_bytes() == (old / "metrics.jsonl").read_bytes()
    assert json.loads(store.get_bytes("j/status.json"))["cost"]["sessions"] == 2


def test_every_sessions_log_stays_in_the_bucket(tmp_path):
    """A new machine's run.log starts empty; the bucket's copy keeps the earlier
    sessions' lines before the new ones (it used to be replaced by the newest machine's)."""
    store = open_store(str(tmp_path / "store"))
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    (old / "run.log").write_text("first machine: step 10\nfirst machine: preempted\n")
    hb = Heartbeat(old, store, "j", period_s=0.05)
    hb.start()
    hb.stop("preempted")
    new.mkdir()
    log = open(new / "run.log", "a")  # noqa: SIM115 - the run's log is open from the start
    log.write("second machine: job j\n")
    log.flush()
    hb = Heartbeat(new, store, "j", period_s=0.05)
    hb.start()
    log.write("second machine: resumed from step 10\n")
    log.close()
    hb.stop("done")
    assert store.get_bytes("j/run.log").decode().splitlines() == [
        "first machine: step 10", "first machine: preempted", "second machine: job j",
        "second machine: resumed from step 10"]
    # the first machine back again: what the two share is not repeated
    hb = Heartbeat(old, store, "j", period_s=0.05)
    hb.start()
    hb.stop("done")
    assert store.get_bytes("j/run.log").decode().count("first machine: step 10") == 1


def test_stall_warns_loudly_and_calls_on_stall_once(tmp_path):
    run_dir = tmp_path / "hung"
    write_metrics(run_dir, train_run(t0=time.time() - 870 - 1500))  # last step 25 min ago
    lines, stalls = [], []

    def on_stall(diagnosis):  # what run_job does before os._exit: a last status
        stalls.append(diagnosis)
        hb.stop("stalled")

    hb = Heartbeat(run_dir, None, "hung", period_s=0.02, log=lines.append,
                   stall_after_s=600, on_stall=on_stall, started=time.time() - 3000)
    hb.start()
    wait_for(lambda: stalls)
    time.sleep(0.1)
    hb.stop("failed")
    assert len(stalls) == 1 and stalls[0].code == "stalled"
    assert len(lines) == 1 and lines[0].startswith("WARNING stalled: nothing logged for 25 min")
    assert [e["kind"] for e in read_jsonl(run_dir / "events.jsonl")].count("stall") == 1


class BrokenStore:
    url = "s3://down"

    def put_bytes(self, key, data, if_absent=False):
        raise OSError("connection refused")

    def get_bytes(self, key):
        raise OSError("connection refused")


def test_a_broken_store_never_reaches_training(tmp_path):
    run_dir = tmp_path / "r"
    records, _ = recent_run()
    write_metrics(run_dir, records)
    lines = []
    hb = Heartbeat(run_dir, BrokenStore(), "r", period_s=0.01, log=lines.append)
    hb.start()
    time.sleep(0.2)
    hb.event(EventKind.PREEMPTION_NOTICE, detail="aws")
    hb.stop("done")
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"
    assert lines == ["heartbeat: connection refused"]  # rate-limited: once a minute


def test_missing_status_is_one_line_user_error(tmp_path, store_url):
    url, endpoint = store_url
    with pytest.raises(UserError, match="no status for .*nojob: the job has not started"):
        read_statuses(url, "nojob", endpoint)
    assert read_statuses(url, None, endpoint) == []
    assert format_status_table([]) == "no jobs with a heartbeat"
    with pytest.raises(UserError, match="no such directory"):
        read_statuses(str(tmp_path / "missing"))


def test_the_per_step_signal_keeps_a_slow_run_alive(tmp_path):
    """Logging every 10 steps of 30 s: 5 minutes between records, stall_after_s 60."""
    now = time.time()
    run_dir = tmp_path / "slow"
    write_metrics(run_dir, [{"kind": "start", "step": 0, "time": now - 280,
                             "total_steps": 100, "device": "cpu"}])
    hb = Heartbeat(run_dir, None, "slow", period_s=30, stall_after_s=60,
                   started=now - 290, log=lambda s: None)
    hb.step(9)  # what the trainer calls after every step
    status = hb.beat()
    assert status["step"] == 9 and status["diagnoses"] == []
    stalled = build_status("slow", hb.records, [], [], now + 100, stall_after_s=60,
                           session_start=now - 290, last_step=(9, now - 5))
    assert [d["code"] for d in stalled["diagnoses"]] == ["stalled"]
    assert stalled["diagnoses"][0]["message"].startswith("stalled: no step for 105 s")


def test_ctrl_c_is_recorded_as_stopped_by_the_user(tmp_path):
    run_dir = tmp_path / "r"
    write_metrics(run_dir, train_run(t0=time.time() - 100))
    hb = Heartbeat(run_dir, None, "r", period_s=30)
    hb.start()
    hb.stop("preempted", exit_code=75, reason="SIGINT")
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["exit_code"], status["stop_reason"]) == \
        ("stopped", 75, "SIGINT")
    (stop,) = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "stop"]
    assert (stop["state"], stop["reason"]) == ("stopped", "SIGINT")
    hb = Heartbeat(run_dir, None, "r", period_s=30)  # run again: resumes
    hb.start()
    time.sleep(0.01)  # the trainer's resumed start record comes after the heartbeat's
    write_metrics(run_dir, train_run(steps=[310], t0=time.time() + 5, start_step=300,
                                     resumed=True), mode="a")
    hb.stop("preempted", exit_code=75, reason="SIGTERM")  # a real preemption this time
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "preempted"
    assert (status["cost"]["preemptions"], status["cost"]["user_stops"]) == (0, 1)


def test_tensorboard_event_files_go_to_the_store(tmp_path, store_url):
    url, endpoint = store_url
    store = open_store(url, endpoint)
    run_dir = tmp_path / "run"
    records, _ = recent_run()
    write_metrics(run_dir, records)
    tb = run_dir / "tensorboard"
    tb.mkdir()
    (tb / "events.out.tfevents.1.host.1.0").write_bytes(b"first")
    hb = Heartbeat(run_dir, store, "j", period_s=30, files_every=1, log=lambda s: None)
    hb.beat()
    assert store.get_bytes("j/tensorboard/events.out.tfevents.1.host.1.0") == b"first"
    with open(tb / "events.out.tfevents.1.host.1.0", "ab") as f:
        f.write(b" more")  # the writer appends
    (tb / "sub").mkdir()
    (tb / "sub" / "events.out.tfevents.2").write_bytes(b"x")
    hb.beat()
    assert store.get_bytes("j/tensorboard/events.out.tfevents.1.host.1.0") == b"first more"
    assert store.get_bytes("j/tensorboard/sub/events.out.tfevents.2") == b"x"


class EventDuringUpload:
    """A local store that lets an event land while a beat uploads status.json: the
    moment the trainer's thread commits a checkpoint between the beat reading
    events.jsonl and uploading it (what a loaded machine does by chance)."""

    def __init__(self, store):
        self.store, self.heartbeat, self.armed = store, None, False

    def put_bytes(self, key, data, if_absent=False):
        if self.armed and key.endswith("/status.json"):
            self.armed = False
            self.heartbeat.checkpoint_committed("step-00000300", 1.0)
        return self.store.put_bytes(key, data, if_absent)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_the_store_never_has_events_newer_than_its_status(tmp_path):
    store = EventDuringUpload(open_store(str(tmp_path / "store")))
    run_dir = tmp_path / "r"
    records, _ = recent_run()
    write_metrics(run_dir, records)
    hb = store.heartbeat = Heartbeat(run_dir, store, "r", period_s=30, log=lambda s: None)
    hb.event(EventKind.START)
    store.armed = True
    hb.beat()  # the checkpoint event arrives mid-beat: this beat's status lacks it ...
    assert b"checkpoint" not in store.get_bytes("r/events.jsonl")  # ... so do its events
    hb.beat()
    status = json.loads(store.get_bytes("r/status.json"))
    assert status["last_checkpoint"]["step"] == 300
    assert b"checkpoint" in store.get_bytes("r/events.jsonl")
