"""Whole runs: ``ten-runner run`` / ``submit`` in subprocesses, killed and resumed, with
checkpoints on disk or in a bucket (moto, rclone). Seconds each, so every test here is
marked slow and the inner loop (``pytest -m "not slow"``) skips the folder."""

import pytest


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.slow)
