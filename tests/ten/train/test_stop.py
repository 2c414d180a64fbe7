"""ten.train.stop.Stop: what a stop signal does in each mode of a process, the watchdog behind
native code, and the last act. Each case runs in a fresh interpreter: signal handlers
and the wake-up pipe are the process's, not the test runner's to change."""

import subprocess
import sys

import pytest

from ten.train.stop import PREEMPTED


def run(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    script = ("import os, signal, sys, time\n"
              "from ten.train.stop import Interrupted, Stop\n"
              "def kill(sig):\n"
              "    os.kill(os.getpid(), sig)\n"
              "    time.sleep(1)  # the handler runs on the way back to the interpreter\n"
              + body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout)


def test_outside_the_loop_a_signal_raises_interrupted_naming_it():
    p = run("stop = Stop()\nstop.install()\nstop.set_phase('data preparation')\n"
            "try:\n    kill(signal.SIGTERM)\n    print('went on')\n"
            "except Interrupted as e:\n    stop.handled()\n"
            "    print(e.name, 'during', stop.phase)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "SIGTERM during data preparation\n"


def test_inside_the_loop_a_signal_is_a_flag_and_a_second_ctrl_c_raises():
    p = run("stop = Stop()\nstop.install()\n"
            "with stop.in_loop():\n    kill(signal.SIGINT)\n    print('flag', stop.reason)\n"
            "    try:\n        kill(signal.SIGINT)\n    except KeyboardInterrupt:\n"
            "        print('insisted')\n"
            "stop.raise_if_received()  # the loop's own signal is not re-raised after it\n"
            "print('after', stop.mode)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["flag SIGINT", "insisted", "after raise"]


def test_a_request_from_a_thread_stops_the_loop_like_a_signal():
    p = run("import threading\nstop = Stop()\n"
            "with stop.in_loop():\n"
            "    threading.Thread(target=stop.request, args=('aws preemption notice',)).start()\n"
            "    while stop.reason is None:\n        time.sleep(0.01)\n"
            "print(stop.reason)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "aws preemption notice\n"


def test_the_library_alone_installs_its_handlers_for_the_loop_only():
    p = run("stop = Stop()\nbefore = signal.getsignal(signal.SIGTERM)\n"
            "with stop.in_loop():\n    kill(signal.SIGTERM)\n"
            "print(stop.reason, signal.getsignal(signal.SIGTERM) is before)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "SIGTERM True\n"


def test_during_the_final_upload_signals_are_noted_then_the_stop_stands():
    p = run("stop = Stop(log=print)\nstop.install()\n"
            "with stop.deferred('the upload of step-00000004'):\n"
            "    kill(signal.SIGTERM)\n    kill(signal.SIGTERM)\n    print('uploaded')\n"
            "try:\n    stop.raise_if_received()\nexcept Interrupted as e:\n"
            "    stop.handled()\n    print('then', e.name)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "uploaded",
        "2 stop signal(s) (SIGTERM) during the upload of step-00000004: finishing it first, "
        "as it did",
        "then SIGTERM"]


def test_native_code_holding_the_main_thread_is_ended_by_the_watchdog():
    # The main thread blocks SIGTERM and waits in C (system(3), whose child sends the
    # signal once the wait has begun: no race with the main thread getting there): the
    # signal lands on another thread, the Python handler cannot run, and only the
    # watchdog can end the process.
    p = run("import ctypes\nstop = Stop(grace_s=0.2)\nstop.install()\n"
            "stop.set_phase('tokenizer training')\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "ctypes.CDLL(None).system(b'kill -TERM $PPID; exec sleep 5 >/dev/null 2>&1')\n"
            "print('not reached')\n")
    assert p.returncode == PREEMPTED, p.stderr
    assert "stopped by SIGTERM during tokenizer training: the process did not answer " \
           "within 0.2 s, exiting now" in p.stderr
    assert "not reached" not in p.stdout


def test_the_watchdog_ends_nothing_for_a_signal_that_is_no_stop():
    """Every signal with a Python handler reaches the wake-up pipe; torch's DataLoader
    handles SIGCHLD, so a worker exiting outside the loop (the loader shut down before
    the final evaluation) ended a healthy process with 75 after the grace period."""
    p = run("stop = Stop(grace_s=0.2)\nstop.install()\n"
            "signal.signal(signal.SIGCHLD, lambda *a: None)  # as torch's DataLoader does\n"
            "import subprocess\nsubprocess.run(['true'])  # a child exits: SIGCHLD\n"
            "time.sleep(1)  # five grace periods\nprint('went on')\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "went on\n"


def test_the_watchdog_stands_down_inside_the_loop():
    p = run("import ctypes\nstop = Stop(grace_s=0.2)\nstop.install()\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "with stop.in_loop():\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    ctypes.CDLL(None).sleep(1)  # five grace periods: the step takes its time\n"
            "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
            "print('step finished', stop.reason)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "step finished SIGTERM\n"


def test_a_stop_during_the_final_teardown_keeps_the_exit_code():
    """Once the outcome is decided, a SIGTERM while the interpreter tears down (threads
    joined, atexit handlers run) must not turn exit 0 into a death by signal."""
    p = run("import atexit\nstop = Stop()\nstop.install()\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))\n"
            "stop.end_process(0)\n")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("code", [PREEMPTED, 0])
def test_only_a_preempted_exit_leaves_background_uploads_behind(code):
    """After a preemption everything is committed and the notice window is short: an
    upload still in flight in a thread pool must not hold the exit (Python joins pool
    threads at exit: a hung request once held an attempt for ~60 s). Other exits finish
    their work."""
    body = ("from concurrent.futures import ThreadPoolExecutor\n"
            "ThreadPoolExecutor(1).submit(time.sleep, 60)  # an upload waiting on the network\n"
            f"print('committed', flush=True)\nStop().end_process({code})\n")
    if code == PREEMPTED:
        p = run(body, timeout=30)
        assert p.returncode == PREEMPTED and p.stdout == "committed\n"
    else:
        with pytest.raises(subprocess.TimeoutExpired):
            run(body, timeout=5)


def test_a_supervisor_relays_signals_and_the_watchdog_leaves_it_to_its_children():
    # The multi-GPU launcher: each signal goes on to the ranks, however long they take.
    p = run("import ctypes\nstop = Stop(grace_s=0.2)\nstop.install()\ngot = []\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "with stop.relaying(got.append):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    ctypes.CDLL(None).sleep(1)  # the ranks commit: five grace periods\n"
            "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
            "print('relayed', [signal.Signals(s).name for s in got], stop.mode)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "relayed ['SIGTERM'] raise\n"


def test_installed_for_a_block_puts_back_what_it_found():
    """A command run in-process (export-model under a test runner) left its handlers,
    wake-up pipe and watchdog behind: a later SIGTERM the caller handles itself was
    read by the old watchdog and ended the process with 75."""
    p = run("stop = Stop(grace_s=0.2)\n"
            "with stop.installed():\n    pass\n"
            "got = []\nsignal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
            "kill(signal.SIGTERM)\ntime.sleep(1)  # five grace periods\n"
            "print(got == [signal.SIGTERM], signal.set_wakeup_fd(-1))\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "True -1\n"
