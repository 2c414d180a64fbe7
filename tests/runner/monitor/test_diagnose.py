"""Diagnoses from recorded tables: each rule fires on its case and stays quiet on a
healthy run."""

import pytest
from monitor_tables import GB, T0, gpu_run, last_time, train_run

from runner.monitor.diagnose import diagnose, stall_threshold


def codes(found):
    return [d.code for d in found]


def healthy():
    return train_run(), gpu_run()


def data_bound():
    return train_run(data_wait=0.38, tok_s=9_000.0, mfu=0.11), gpu_run(util=41)


def throttled():
    return train_run(), gpu_run(hot_from=25)


def small_batch():
    return train_run(), gpu_run(mem_used=15 * GB)


def checkpoint_heavy():
    return train_run(ckpt=0.22), gpu_run()


def underused():
    return train_run(mfu=0.08), gpu_run(util=35, throttle=())


def xid():
    return train_run(), gpu_run(xid=(79,))


def hw_brake():
    return train_run(), gpu_run(throttle=("sw_power_cap", "hw_power_brake"))


CASES = [  # (name, table, minutes after the last record, expected codes in order)
    ("healthy L40S at its power cap", healthy, 0.5, ["power-cap"]),
    ("data-bound", data_bound, 0.5, ["data-bound", "power-cap"]),
    ("thermal throttling", throttled, 0.5, ["thermal"]),
    ("memory headroom", small_batch, 0.5, ["power-cap", "memory-headroom"]),
    ("checkpoint-heavy", checkpoint_heavy, 0.5, ["checkpoint-bound", "power-cap"]),
    ("GPU underused", underused, 0.5, ["low-util"]),
    ("XID error", xid, 0.5, ["gpu-errors", "power-cap"]),
    ("hardware power brake", hw_brake, 0.5, ["power-brake"]),
    ("hang: no step for 15 min", healthy, 15, ["stalled"]),
]


@pytest.mark.parametrize("name, table, minutes, expected", CASES, ids=[c[0] for c in CASES])
def test_diagnoses(name, table, minutes, expected):
    records, samples = table()
    now = last_time(records) + 60 * minutes
    if minutes > 5:  # during a hang the sampler still runs: the GPU sits idle
        samples += gpu_run(t0=last_time(samples) + 10, n=80, util=0, power=80.0, throttle=())
    assert codes(diagnose(records, samples, now, stall_after_s=600)) == expected


def test_messages_carry_the_figures_and_the_fix():
    records, samples = data_bound()
    (d, _) = diagnose(records, samples, last_time(records) + 30, 600)
    assert d.severity == "warning"
    assert d.message == ("data-bound: 38% of step waiting for batches, GPU util 41% — use "
                         "pretokenized mode or more workers")
    records, samples = throttled()
    (d,) = diagnose(records, samples, last_time(samples) + 5, 600)
    since = samples[25]["time"]  # 00:05 UTC in the recording
    assert d.message.startswith(f"thermal throttling since 00:0{int((since - T0) // 60)} UTC "
                                "(89°C, SM 1410 MHz)")
    records, samples = small_batch()
    assert diagnose(records, samples, last_time(records) + 30, 600)[-1].message == \
        "GPU memory 31% used — batch can grow"


def test_stall_message_and_severity():
    records, samples = healthy()
    samples += gpu_run(t0=last_time(samples) + 10, n=80, util=0, throttle=())
    (d,) = diagnose(records, samples, last_time(records) + 600 + 60, 600)
    assert d.severity == "critical"
    assert d.message.startswith("stalled: no step for 11 min, GPU util 0% (last record: "
                                "step 300 at ")
    assert "data loader" in d.message


def test_no_stall_before_the_threshold_or_after_the_end():
    records, samples = healthy()
    assert "stalled" not in codes(diagnose(records, samples, last_time(records) + 590, 600))
    ended = records + [{"kind": "end", "step": 300, "time": last_time(records) + 1}]
    assert diagnose(ended, samples, last_time(records) + 86_400, 600) == []


def test_sparse_logging_is_not_a_stall():
    records = train_run(every_s=1200.0)  # log every 20 min
    assert stall_threshold([r for r in records if r["kind"] == "train"], 600) == 3600
    assert "stalled" not in codes(diagnose(records, [], last_time(records) + 1500, 600))
    assert "stalled" in codes(diagnose(records, [], last_time(records) + 3700, 600))


def test_no_gpu_samples_and_no_records():
    assert diagnose([], [], T0, 600) == []
    records = train_run(data_wait=0.5)
    (d,) = diagnose(records, [], last_time(records) + 10, 600)
    assert d.message == ("data-bound: 50% of step waiting for batches — use pretokenized "
                         "mode or more workers")


def test_a_previous_life_is_not_a_stall():
    records, samples = healthy()  # the session before a preemption
    restarted = last_time(records) + 3600  # this process: preparing data for 20 min
    now = restarted + 1200
    assert "stalled" in codes(diagnose(records, samples, now, 600))
    assert diagnose(records, samples, now, 600, session_start=restarted) == []
