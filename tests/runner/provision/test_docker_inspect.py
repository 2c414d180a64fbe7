"""Reading `docker inspect`'s answer (runner.provision.docker.inspected): the state line
is found whatever warnings docker prints beside it (the provider reads docker's stdout
and stderr together, on this machine and over ssh)."""

import pytest

from runner.provision.base import Phase, ProvisionError
from runner.provision.docker import inspected

WARNING = "WARNING: Error loading config file: /home/u/.docker/config.json: permission denied"


@pytest.mark.parametrize("output, phase, code", [
    ("running 0 false\n", Phase.RUNNING, None),
    (f"{WARNING}\nexited 3 false\n", Phase.EXITED, 3),
    (f"exited 137 true\n{WARNING}\n", Phase.PREEMPTED, 137),
    ("created 0 false", Phase.PENDING, None),
], ids=["alone", "after-a-warning", "before-a-warning", "no-line-end"])
def test_the_state_line_is_read_among_warnings(output, phase, code):
    status = inspected(output, "ten-j-1")
    assert (status.phase, status.exit_code) == (phase, code)


def test_an_answer_without_a_state_line_is_one_line_naming_it():
    with pytest.raises(ProvisionError, match="unexpected answer from docker inspect ten-j-1"):
        inspected(f"{WARNING}\n", "ten-j-1")
