"""runner.stopping's last act: once a run's outcome is decided, no stop signal changes
its exit code."""

import subprocess
import sys


def test_a_stop_during_the_final_teardown_keeps_the_exit_code():
    """Once the run's outcome is decided, a SIGTERM while the interpreter tears down (its
    threads joined, atexit handlers run) must not turn exit 0 into a death by signal."""
    script = (
        "import atexit, os, signal, time\n"
        "from runner import stopping\n"
        "from runner.stopping import exit_process\n"
        "stopping.install()\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))\n"
        "exit_process(0)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
