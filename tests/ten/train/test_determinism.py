"""``train.deterministic``: what it switches on, before the first cuBLAS handle."""

import os

import torch
from runhelpers import MINIMAL_JOB

from runner.job import parse_job
from runner.job.library import train_config
from ten.train.trainer import make_deterministic


def _restoring(fn):
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    try:
        fn()
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark


def test_deterministic_mode_fixes_the_cublas_workspace_and_the_algorithms(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def check():
        make_deterministic()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # never a crash
        assert torch.backends.cudnn.benchmark is False
    _restoring(check)


def test_a_workspace_the_user_chose_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    _restoring(make_deterministic)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_the_job_key_reaches_the_trainer_and_is_off_by_default():
    assert train_config(parse_job(MINIMAL_JOB, check_model=False)).deterministic is False
    job = parse_job(MINIMAL_JOB, check_model=False, sets=["train.deterministic=true"])
    assert train_config(job).deterministic is True
