"""How long the tests that start whole processes wait, on a machine that may be busy.

A limit on a process is a limit on its silence, not on its whole run: one that keeps
printing (a training run logs every step) is given up to ``CAP`` times the limit, and
only one that prints nothing for the whole limit is called stuck. When a limit does
expire, the failure says how loaded the machine was, so that a slow machine does not
read as a broken tool (the README's test command once ended "6 failed" on a loaded
2-core machine, all six fixed limits, all passing on a rerun).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

CAP = 5  # a process that keeps printing gets at most this many times its limit


def machine_note() -> str:
    """The machine's load, and what it means for a failed wait."""
    load1, load5, _ = os.getloadavg()
    cores = os.cpu_count() or 1
    note = f"load average {load1:.1f} (5 min: {load5:.1f}) on {cores} cores"
    if load1 > cores:
        note += ("; the machine is busy, so slow here is not necessarily broken: rerun on "
                 "an idle machine before reading it as a bug")
    return note


def communicate(proc: subprocess.Popen, limit: float) -> tuple[Any, Any]:
    """``proc.communicate()``, patient while the process prints (see the module doc).
    When it prints nothing for ``limit`` seconds, or runs ``CAP`` times that, it is
    killed and an AssertionError says so, with its last output and the machine's load."""
    pipes = [s for s in (proc.stdout, proc.stderr) if s is not None]
    if not pipes:
        try:
            proc.wait(timeout=limit * CAP)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{_name(proc)} still running after {limit * CAP:.0f} s "
                                 f"({machine_note()})") from None
        return None, None
    heard = [time.monotonic()]
    chunks: dict[Any, list[Any]] = {s: [] for s in pipes}

    def read(stream: Any) -> None:
        while line := stream.readline():
            chunks[stream].append(line)
            heard[0] = time.monotonic()

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in pipes]
    for r in readers:
        r.start()
    start = time.monotonic()
    while proc.poll() is None:
        now = time.monotonic()
        if now - heard[0] > limit or now - start > limit * CAP:
            proc.kill()
            proc.wait()
            for r in readers:
                r.join()
            quiet = now - heard[0] > limit
            said = "".join(map(_text, (chunks[pipes[-1]][-5:])))
            raise AssertionError(
                f"{_name(proc)} {'printed nothing for' if quiet else 'ran past'} "
                f"{limit if quiet else limit * CAP:.0f} s and was killed ({machine_note()}); "
                f"it last printed: {said[-1500:]!r}")
        time.sleep(0.05)
    for r in readers:
        r.join()
    out = [("" if hasattr(s, "encoding") else b"").join(chunks[s]) for s in pipes]
    return (out.pop(0) if proc.stdout is not None else None,
            out.pop(0) if proc.stderr is not None else None)


def wait_until(predicate: Callable[[], Any], limit: float = 120.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something true (returned); after ``limit``
    seconds an AssertionError naming ``what`` and the machine's load."""
    deadline = time.monotonic() + limit
    while not (found := predicate()):
        assert time.monotonic() < deadline, \
            f"no {what} within {limit:.0f} s ({machine_note()})"
        time.sleep(0.05)
    return found


def _name(proc: subprocess.Popen) -> str:
    args = proc.args if isinstance(proc.args, list | tuple) else [proc.args]
    return "`" + " ".join(str(a) for a in args[1:4]) + "`"


def _text(chunk: Any) -> str:
    return chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk
