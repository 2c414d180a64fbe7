"""A spot provider declares itself (runner/preemption/providers/): its module alone
makes it a ``resources.spot_notice`` value, a cloud detection can find and one the
watcher polls. Checked on a copy of this code with one module added, as a new cloud
adds it, in a fresh interpreter."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from runhelpers import MINIMAL_JOB, copy_of_the_code

from runner.preemption import DEFAULT_ENDPOINTS, PROVIDERS, notice_window_s

NEW_PROVIDER = '''"""A spot provider a test adds: its service answers at http://thunder.test and has
announced a preemption."""

from runner.preemption.notices import Notice
from runner.preemption.providers import SpotProvider


class ThunderPoller:
    def __init__(self, base, timeout_s):
        self.base = base

    def poll(self, now):
        return Notice("thunder", now, now + 45.0, f"reclaim announced at {self.base}")


PROVIDER = SpotProvider("thunder", title="Thunder", window_s=45.0,
                        endpoint="http://thunder.test",
                        probe=lambda base, timeout_s: base == "http://thunder.test",
                        poller=ThunderPoller)
'''

USE_IT = textwrap.dedent('''
    import threading
    from runner.preemption import (DEFAULT_ENDPOINTS, NoticeWatcher, detect_provider,
                                   notice_window_s, startup_warning)

    print("detected", detect_provider({"thunder": DEFAULT_ENDPOINTS["thunder"],
                                       "aws": "http://127.0.0.1:9"}, timeout_s=0.2))
    print("window", notice_window_s("thunder"))
    print("warning", startup_warning("thunder", 60.0))
    heard = threading.Event()
    lines = []
    with NoticeWatcher("thunder", lambda notice: heard.set(), interval_s=0.05, log=lines.append):
        assert heard.wait(10)
    print("log", lines[-1])
''')


def run(code: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=code, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin",
                                            "HOME": str(code)})


def test_the_providers_here_are_aws_gcp_and_azure_in_that_order():
    assert PROVIDERS == ("aws", "gcp", "azure")
    assert [notice_window_s(p) for p in PROVIDERS] == [120.0, 30.0, 30.0]
    assert DEFAULT_ENDPOINTS["gcp"] == "http://metadata.google.internal"


@pytest.mark.slow  # processes on a copy of the code
def test_a_new_providers_module_alone_is_a_spot_notice_detected_and_watched(tmp_path):
    code = copy_of_the_code(tmp_path / "code")
    (code / "runner" / "preemption" / "providers" / "thunder.py").write_text(NEW_PROVIDER)
    (code / "job.yaml").write_text(MINIMAL_JOB + "resources: {spot_notice: thunder}\n")
    (code / "typo.yaml").write_text(MINIMAL_JOB + "resources: {spot_notice: thundr}\n")

    ok = run(code, "-m", "runner.cli", "validate", "--no-path-checks", "job.yaml")
    assert ok.returncode == 0, ok.stderr[-2000:]
    typo = run(code, "-m", "runner.cli", "validate", "--no-path-checks", "typo.yaml")
    assert typo.returncode == 2, typo.stderr
    assert "resources.spot_notice" in typo.stderr and "'thunder'" in typo.stderr, typo.stderr

    used = run(code, "-c", USE_IT)
    assert used.returncode == 0, used.stderr[-2000:]
    said = dict(line.split(" ", 1) for line in used.stdout.splitlines())
    assert said["detected"] == "thunder"
    assert said["window"] == "45.0"
    assert "the Thunder notice window is 45 s" in said["warning"]
    assert said["log"].startswith("preemption: Thunder notice (reclaim announced at "
                                  "http://thunder.test)"), said["log"]
