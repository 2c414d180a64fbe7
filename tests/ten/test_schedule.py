import math

import pytest

from ten.schedule import lr_multiplier


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
