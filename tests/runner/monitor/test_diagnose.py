"""Diagnoses from recorded tables: each rule fires on its case and stays quiet on a
healthy run."""

import pytest
from monitor_tables import GB, T0, TOKENS_PER_STEP, gpu_run, last_time, train_run

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
    # Without the per-step signal only records are seen: the message says so.
    assert d.message.startswith("stalled: nothing logged for 11 min, GPU util 0% (last "
                                "record: step 300 at ")
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


def slow_run(t0, first_record=True):
    """Logs every 10 steps, one step every 30 s: a record only every 5 minutes."""
    records = [{"kind": "start", "step": 0, "time": t0, "total_steps": 1000,
                "resumed": False, "device": "cuda:0"}]
    if first_record:
        records.append({"kind": "train", "step": 10, "time": t0 + 300, "loss": 6.0,
                        "tokens": 10 * TOKENS_PER_STEP, "step_time_s": 30.0,
                        "data_wait_frac": 0.01, "checkpoint_frac": 0.0})
    return records


def test_a_slow_run_that_completes_steps_is_not_stalled():
    t0 = T0
    # Step 17 finished 20 s ago, the record of step 20 is 70 s away: stall_after_s 60.
    now = t0 + 300 + 7 * 30 + 20
    assert "stalled" not in codes(diagnose(slow_run(t0), [], now, 60, last_step=(17, now - 20)))
    # Before its first train record too (5 minutes of steps with nothing logged).
    now = t0 + 170
    assert "stalled" not in codes(diagnose(slow_run(t0, False), [], now, 60,
                                           last_step=(5, t0 + 150)))


def test_no_step_for_longer_than_stall_after_s_is_a_stall():
    t0 = T0
    last = t0 + 300 + 7 * 30
    (d,) = diagnose(slow_run(t0), [], last + 100, 60, last_step=(17, last))
    assert d.code == "stalled" and d.message.startswith("stalled: no step for 100 s (last "
                                                        "step 17 at ")
    # Usual steps of 30 s: a step is overdue after 3 of them, not after stall_after_s.
    assert diagnose(slow_run(t0), [], last + 80, 60, last_step=(17, last)) == []
    # No step time known yet: stall_after_s itself.
    (d,) = diagnose(slow_run(t0, False), [], t0 + 150 + 61, 60, last_step=(5, t0 + 150))
    assert d.code == "stalled"


def test_without_the_step_signal_the_gap_after_one_record_is_predicted():
    """Records only: the next one is due 10 steps x 30 s after the last, not in 60 s."""
    t0 = T0
    assert diagnose(slow_run(t0), [], t0 + 300 + 120, 60) == []
    assert "stalled" in codes(diagnose(slow_run(t0), [], t0 + 300 + 1000, 60))


def test_a_step_of_a_previous_life_is_not_progress():
    t0 = T0
    restarted = t0 + 1000  # this process is still preparing its data
    assert diagnose(slow_run(t0), [], restarted + 600, 60, session_start=restarted,
                    last_step=(17, t0 + 990)) == []
