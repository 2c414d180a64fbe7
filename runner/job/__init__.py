"""The job YAML: schema, loading with file:line errors, ``--set`` overrides, secrets.

    from runner.job import Job, JobError, load_job
    job = load_job("jobs/tiny-cpu.yaml", sets=["train.max_steps=20"])

Modules: :mod:`~runner.job.yamlfile` (safe YAML with key lines), :mod:`~runner.job.schema`
(the typed sections), :mod:`~runner.job.secrets` (``${VAR}`` and redaction),
:mod:`~runner.job.checks` (cross-field, model and dataset checks),
:mod:`~runner.job.errors` (messages), :mod:`~runner.job.load` (putting it together).
"""

from runner.job.errors import JobError
from runner.job.load import Job, load_job, parse_job
from runner.job.schema import ARCHS, PRESETS


def json_schema() -> dict:
    """The JSON Schema of a job file (for editor completion)."""
    schema = Job.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


__all__ = ["ARCHS", "PRESETS", "Job", "JobError", "json_schema", "load_job", "parse_job"]
