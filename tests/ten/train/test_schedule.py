import math

import pytest

from ten.train.schedule import Schedule, lr_multiplier


@pytest.mark.parametrize("schedule,step,expected", [
    ("constant", 0, 0.1), ("constant", 9, 1.0), ("constant", 500, 1.0),
    ("cosine", 0, 0.1), ("cosine", 4, 0.5), ("cosine", 9, 1.0), ("cosine", 10, 1.0),
    ("cosine", 60, 0.1 + 0.9 * 0.5), ("cosine", 110, 0.1), ("cosine", 1000, 0.1),
    ("onecycle", 9, 1.0), ("onecycle", 110, 0.1),
])
def test_schedule_table(schedule, step, expected):
    assert math.isclose(lr_multiplier(step, 110, 10, schedule, 0.1), expected, rel_tol=1e-9)


def test_onecycle_starts_low_and_rises_smoothly():
    values = [lr_multiplier(s, 100, 20, "onecycle", 0.0) for s in range(20)]
    assert 0.04 < values[0] < 0.06 and values == sorted(values) and values[-1] == 1.0


def test_no_warmup_and_monotone_decay():
    values = [lr_multiplier(s, 50, 0, "cosine", 0.0) for s in range(51)]
    assert values[0] == 1.0 and values[-1] == 0.0
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_unknown_schedule():
    with pytest.raises(ValueError, match="schedule must be one of"):
        lr_multiplier(0, 10, 0, "linear", 0.1)


@pytest.mark.parametrize("step,expected", [
    (0, 0.1), (9, 1.0), (50, 1.0), (89, 1.0),  # warm-up 10, level until 110 - 20 = 90
    (90, 1.0), (95, 0.1 + 0.9 * (1 - math.sqrt(0.25))), (110, 0.1), (500, 0.1),
])
def test_wsd_table(step, expected):
    schedule = Schedule("wsd", 110, 10, 0.1, decay_fraction=0.2)
    assert math.isclose(schedule(step), expected, rel_tol=1e-9)


def test_a_schedule_resumed_where_it_agrees_is_unchanged():
    schedule = Schedule("cosine", 110, 10, 0.1)
    assert schedule.continued(60, schedule(60)) is schedule
    wsd = Schedule("wsd", 110, 10, 0.1)
    # extended in its level part: the longer schedule as it is, no anchor
    assert Schedule("wsd", 300, 10, 0.1).continued(50, wsd(50)).anchor is None


@pytest.mark.parametrize("shape", ["cosine", "onecycle", "wsd", "constant"])
def test_an_extended_schedule_goes_on_from_the_resumed_multiplier(shape):
    finished = Schedule(shape, 110, 10, 0.1)
    at = 60
    longer = Schedule(shape, 300, 10, 0.1).continued(at, finished(at))
    values = [longer(s) for s in range(at, 301)]
    assert values[0] == finished(at)
    assert values == sorted(values, reverse=True)  # never back up
    end = finished(at) if shape == "constant" else 0.1
    assert math.isclose(values[-1], end, rel_tol=1e-9)


def test_the_anchor_survives_a_checkpoint():
    anchored = Schedule("cosine", 300, 10, 0.1).continued(110, 0.1)
    again = Schedule("cosine", 300, 10, 0.1).with_saved(anchored.saved())
    assert again == anchored and again.continued(150, anchored(150)) is again


def test_a_checkpoint_without_an_anchor_clears_one_from_a_newer_attempt():
    """A resume that fell back to an older checkpoint kept the anchor the newer one had
    set; the saved anchor, or none, is the schedule's."""
    anchored = Schedule("cosine", 300, 10, 0.1).continued(110, 0.1)
    assert anchored.anchor is not None and anchored.with_saved(None).anchor is None
