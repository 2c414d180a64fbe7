"""Every job key ten.data's errors name exists in the job schema (hints name real keys)."""

from __future__ import annotations

import dataclasses

import pytest

from runner.job.schema import JobSchema
from ten.data.config import DataConfig, job_key


def _resolves(dotted: str) -> bool:
    model = JobSchema
    for part in dotted.split("."):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return False
        model = field.annotation
    return True


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(DataConfig)])
def test_job_key_names_a_real_key(field):
    key = job_key(field)
    assert key.startswith("DataConfig.") or _resolves(key), key
    # and a field the job does have is never named by its library name
    if key.startswith("DataConfig."):
        assert not _resolves(f"data.{field}")
