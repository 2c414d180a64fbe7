"""The tests' own waiting (tests/support/patience.py): a process that keeps printing is
waited for past its limit; a silent one is killed at the limit, and the failure says how
loaded the machine was."""

from __future__ import annotations

import subprocess
import sys

import pytest
from patience import communicate, machine_note

TALKER = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\n"


def test_a_process_that_keeps_printing_is_waited_for_past_its_limit():
    proc = subprocess.Popen([sys.executable, "-c", TALKER], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = communicate(proc, limit=2.5)  # the whole run takes about 4 s
    assert proc.returncode == 0 and out.split() == [str(i) for i in range(8)] and err == ""


def test_a_silent_process_is_killed_at_its_limit_and_the_load_is_named():
    proc = subprocess.Popen([sys.executable, "-c", "print('started', flush=True)\n"
                             "import time; time.sleep(600)"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with pytest.raises(AssertionError, match=r"printed nothing for 1 s and was killed "
                                             r"\(load average .* cores"):
        communicate(proc, limit=1.0)
    assert proc.returncode is not None  # killed, not left behind


def test_the_machine_note_says_when_the_machine_is_busy(monkeypatch):
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 7.5, 5.0))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert machine_note().startswith("load average 9.0 (5 min: 7.5) on 2 cores; the "
                                     "machine is busy")
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.4, 0.3))
    assert machine_note() == "load average 0.5 (5 min: 0.4) on 2 cores"
