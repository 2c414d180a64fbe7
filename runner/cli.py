"""The ``ten-runner`` command line.

Thin by design: every command parses its arguments and hands off to a module that
does the work. Heavy imports (torch) happen inside commands, never at import time,
so ``ten-runner --help`` returns in a fraction of a second.
"""

from __future__ import annotations

import json

import click

from runner.errors import UserError
from runner.exit_codes import ExitCode


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ten-runner")
def cli() -> None:
    """Train Temporal Eigenstate Network language models locally or on rented GPUs."""


@cli.command()
@click.option("--arch", type=click.Choice(["ten", "transformer"]), default="ten",
              show_default=True, help="Model family to list.")
def presets(arch: str) -> None:
    """Print the named model presets with parameter counts and FLOPs per token."""
    from ten.presets import format_preset_table

    click.echo(format_preset_table(arch))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a field, e.g. --set train.lr=1e-3 (value parsed as YAML).")
def validate(files: tuple[str, ...], sets: tuple[str, ...]) -> None:
    """Check job files without running them: every problem, with file:line."""
    from runner.job import JobError, load_job

    bad = 0
    for path in files:
        try:
            job = load_job(path, sets=sets)
        except JobError as err:
            bad += 1
            for line in err.errors:
                click.echo(line, err=True)
            continue
        click.echo(f"ok: {path} ({job.summary()})")
    if bad:
        raise UserError(f"{bad} of {len(files)} job file{'s' if len(files) > 1 else ''} "
                        "invalid", exit_code=ExitCode.CONFIG)


@cli.command()
def schema() -> None:
    """Print the JSON Schema of job files (for editor completion)."""
    from runner.job import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@cli.command()
@click.argument("job_file", type=click.Path())
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a field, e.g. --set train.max_steps=50 (value parsed as YAML).")
@click.option("--no-sample", is_flag=True, help="Skip the text sample printed at the end.")
def run(job_file: str, sets: tuple[str, ...], no_sample: bool) -> None:
    """Run a job: prepare the data, train (resuming from the newest valid checkpoint
    under <storage>/<name>/), evaluate on held-out data, checkpoint.

    Exit codes: 0 done, 1 crash, 2 config error, 3 data error, 75 preempted (a
    checkpoint was committed; run again to resume)."""
    from runner.job import JobError, load_job

    try:
        job = load_job(job_file, sets=sets)
    except JobError as err:
        raise UserError("\n".join(err.errors), exit_code=ExitCode.CONFIG) from None
    from runner.launch import launch, needs_launcher

    if needs_launcher(job):  # resources.gpus > 1: this process supervises torchrun
        raise SystemExit(launch(job_file, sets, job, no_sample=no_sample))
    from runner.run import run_job

    code = run_job(job, sample_prompt=None if no_sample else "The")
    raise SystemExit(int(code))


@cli.command()
@click.argument("run_dir", type=click.Path())
@click.option("--prompt", default="The", show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(0))
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
def sample(run_dir: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int,
           seed: int) -> None:
    """Generate text from the newest valid checkpoint in RUN_DIR (e.g. runs/tiny-cpu)."""
    from runner.run import sample_run

    click.echo(sample_run(run_dir, prompt, max_new_tokens, temperature, top_k, seed))


def _resolve(target: str, job: str | None, endpoint_url: str | None):
    """A job file, a store URL or path, or a run directory -> (where, job, endpoint)."""
    if target.endswith((".yaml", ".yml")):
        from runner.job import JobError, load_job

        try:
            spec = load_job(target, check_model=False)
        except JobError as err:
            raise UserError("\n".join(err.errors), exit_code=ExitCode.CONFIG) from None
        where = spec.storage.url if spec.storage.is_remote else str(spec.storage.local_path())
        return where, job or spec.name, endpoint_url or spec.storage.endpoint_url or None
    return target, job, endpoint_url


_TARGET = click.argument("target", default="./runs")
_JOB = click.option("--job", "job_name", default=None, help="Job name inside a store.")
_ENDPOINT = click.option("--endpoint-url", default=None, help="S3-compatible endpoint.")


@cli.command()
@_TARGET
@_JOB
@_ENDPOINT
def status(target: str, job_name: str | None, endpoint_url: str | None) -> None:
    """Where runs stand, from their heartbeat: TARGET is a job file, a store (./runs,
    s3://bucket/prefix) or a run directory. Works from a laptop while the job runs
    elsewhere; a heartbeat that stopped arriving shows as stale."""
    from runner.monitor.status import format_status_table, read_statuses

    where, job_name, endpoint_url = _resolve(target, job_name, endpoint_url)
    statuses = read_statuses(where, job_name, endpoint_url)
    if not statuses:
        raise UserError(f"no runs with a heartbeat under {where}", exit_code=ExitCode.CONFIG)
    click.echo(format_status_table(statuses))


@cli.command()
@_TARGET
@_JOB
@_ENDPOINT
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is appended.")
@click.option("--interval", default=10.0, show_default=True, help="Seconds between polls.")
def logs(target: str, job_name: str | None, endpoint_url: str | None, follow: bool,
         interval: float) -> None:
    """Print a run's log (from its directory or its store)."""
    from runner.monitor.logs import follow_log, read_log
    from runner.monitor.source import open_run

    where, job_name, endpoint_url = _resolve(target, job_name, endpoint_url)
    if not follow:
        click.echo(read_log(where, job_name, endpoint_url), nl=False)
        return
    try:
        follow_log(open_run(where, job_name, endpoint_url), lambda s: click.echo(s, nl=False),
                   interval_s=interval)
    except KeyboardInterrupt:
        pass


@cli.command()
@_TARGET
@_JOB
@_ENDPOINT
@click.option("--out", "out_dir", default="./reports", show_default=True,
              type=click.Path(file_okay=False), help="Where the PNG and HTML go.")
@click.option("--price-per-hour", type=float, default=None,
              help="USD per machine-hour (default: the job's resources.price_per_hour).")
@click.option("--gpus", type=click.IntRange(1), default=1, show_default=True)
def report(target: str, job_name: str | None, endpoint_url: str | None, out_dir: str,
           price_per_hour: float | None, gpus: int) -> None:
    """Plot a run (loss, eval, tokens/s, MFU, GPU, preemptions) and its cost: GPU-hours
    paid, goodput, $ per 1B tokens. Writes a PNG and an HTML page."""
    from runner.monitor.report import write_report

    where, job_name, endpoint_url = _resolve(target, job_name, endpoint_url)
    png, page = write_report(where, job_name, out_dir, endpoint_url,
                             price_per_hour=price_per_hour, gpus=gpus)
    click.echo(f"wrote {png}\nwrote {page}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
