"""RunLog: each line reaches the console whole, whichever thread says it."""

from __future__ import annotations

import sys
import threading

from runner.run.log import RunLog


class _Writes:
    """A console that keeps each write call apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_line_reaches_stderr_in_one_write(tmp_path, monkeypatch):
    # The heartbeat's "monitor: ..." and the main thread's "stopped by ..." were once
    # glued into one line: print() writes the text and its newline as two calls, and
    # another thread's line can land between them.
    console = _Writes()
    monkeypatch.setattr(sys, "stderr", console)
    log = RunLog(tmp_path)
    log("stopped by a lost writer lease after step 8")
    log.close()
    assert console.writes == ["stopped by a lost writer lease after step 8\n"]


def test_lines_from_threads_stay_whole_on_stderr_and_in_run_log(tmp_path, monkeypatch):
    console = _Writes()
    monkeypatch.setattr(sys, "stderr", console)
    log = RunLog(tmp_path, tag="[rank 0] ")
    said = {f"thread {t} line {i}" for t in range(4) for i in range(200)}

    def say(t: int) -> None:
        for i in range(200):
            log(f"thread {t} line {i}")

    threads = [threading.Thread(target=say, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    assert {w.removeprefix("[rank 0] ").removesuffix("\n") for w in console.writes} == said
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in console.writes)
    logged = (tmp_path / "run.log").read_text().splitlines()
    assert {ln.split(" ", 2)[2].removeprefix("[rank 0] ") for ln in logged} == said
