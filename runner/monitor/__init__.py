"""Watching a run: GPU samples (NVML), diagnoses with a one-line reason, a heartbeat
status and events log in the run directory and the job's store, cost and goodput, a
pre-flight GPU health gate, and the PNG/HTML report.

Nothing here imports torch, matplotlib or pynvml at import time: the CLI stays fast and
a laptop without a GPU reads the status of a job running elsewhere.

Modules, one concept each:

* :mod:`runner.monitor.nvml`      GpuSampler thread, clock-event reason decoding
* :mod:`runner.monitor.diagnose`  pure diagnoses over metrics records and GPU samples
* :mod:`runner.monitor.heartbeat` status.json + events.jsonl writer thread
* :mod:`runner.monitor.source`    reading a run's files from a directory or a store
* :mod:`runner.monitor.status`    ``ten-runner status``: statuses and the table
* :mod:`runner.monitor.logs`      ``ten-runner logs [-f]``: the run log, followed
* :mod:`runner.monitor.cost`      pure cost, lost work and goodput
* :mod:`runner.monitor.report`    PNG + HTML report (matplotlib, Agg)
* :mod:`runner.monitor.health`    pre-flight GPU health gate
"""
