"""One run of a job on this machine (``ten-runner run``): :mod:`.jobrun` (JobRun: the
run from its lock to its exit code), :mod:`.failures` (which failure ends with which exit
code and line), :mod:`.lock` (one writer per run directory), :mod:`.log` (progress lines,
scrubbed of secrets, to stderr and run.log), :mod:`.spot` (a preemption notice wired to
the trainer's stop).
"""
