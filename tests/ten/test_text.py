"""How the project writes what it prints (ten.text): an ETA clock, a duration in prose,
and an aligned table."""

import pytest

from ten.text import clock, duration


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (3725.9, "1:02:05"),
                                           (-5, "0:00:00"), (90000, "25:00:00")])
def test_clock(seconds, text):
    assert clock(seconds) == text


@pytest.mark.parametrize("seconds, text", [(42, "42 s"), (119, "119 s"), (120, "2 min"),
                                           (3720, "62 min"), (7200, "2.0 h"), (-3, "0 s")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_table_aligns_columns_and_trims():
    from ten.text import table

    text = table(("NAME", "N"), [("a", "1"), ("long-name", "12345")], right={1}, rule=True)
    assert text.splitlines() == ["NAME           N",
                                 "---------  -----",
                                 "a              1",
                                 "long-name  12345"]
    assert table(("A", "B"), [("x", "")]).splitlines()[1] == "x"  # no trailing spaces
