"""The ``ten-runner`` command line.

Thin by design: every command parses its arguments and hands off to a module that
does the work. Heavy imports (torch) happen inside commands, never at import time,
so ``ten-runner --help`` returns in a fraction of a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.job.clouds import CLOUDS, cloud_of
from runner.storage import DEFAULT_STORE
from runner.target import resolve_target, submitted_record
from runner.trained.evaluate import MAX_TOKENS
from ten.model.config import ARCHS

# `submit --to`: each cloud's form and what it is (runner/job/clouds/)
TO_FORMS = "|".join(cloud.form for cloud in CLOUDS)
TO_HELP = "; ".join(f"{cloud.form}: {cloud.summary}" for cloud in CLOUDS)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ten-runner")
def cli() -> None:
    """Train Temporal Eigenstate Network language models locally or on rented GPUs."""


@cli.command()
@click.option("--arch", type=click.Choice(ARCHS), default="ten",
              show_default=True, help="Model family to list.")
def presets(arch: str) -> None:
    """Print the named model presets with parameter counts and FLOPs per token."""
    from ten.model.presets import format_preset_table

    click.echo(format_preset_table(arch))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a field, e.g. --set train.lr=1e-3 (value parsed as YAML).")
@click.option("--no-path-checks", is_flag=True,
              help="Do not require a local data.dataset / data.tokenizer.path to exist here "
                   "(for a job whose files exist only where it runs).")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list of {file, ok, errors, summary} on stdout instead.")
def validate(files: tuple[str, ...], sets: tuple[str, ...], no_path_checks: bool,
             as_json: bool) -> None:
    """Check job files without running them: every problem, with file:line.

    Local files must exist (--no-path-checks: they exist only where the job runs); a
    local corpus of up to 4 MB is read whole, its tokenizer trained (the run reuses it),
    so a missing text field, a vocabulary the text cannot fill, or a split shorter than
    one batch is said now, not after training has started. A bucket store without S3
    credentials on this machine is warned about (an instance role elsewhere needs none).

    Exit codes: 0 all valid, 2 any invalid (also with --json)."""
    from runner.job import JobError
    from runner.job.jobfile import load_any

    bad = 0
    results = []
    for path in files:
        try:
            job = load_any(path, sets=sets, check_paths=not no_path_checks, check_card=True)
        except JobError as err:
            bad += 1
            results.append({"file": path, "ok": False, "errors": err.errors, "warnings": [],
                            "summary": None, "model": None})
            if not as_json:
                for line in err.errors:
                    click.echo(line, err=True)
            continue
        warnings = [] if no_path_checks else _credentials_missing(job)
        model = job.model_text()
        results.append({"file": path, "ok": True, "errors": [], "warnings": warnings,
                        "summary": job.summary(), "model": model})
        if not as_json:
            click.echo(f"ok: {path} ({job.summary()})\n  {model}")
            for line in warnings:
                click.echo(f"warning: {path}: {line}", err=True)
    if as_json:
        click.echo(_to_json(results))
    if bad:
        raise UserError(f"{bad} of {len(files)} job file{'s' if len(files) > 1 else ''} "
                        "invalid", exit_code=ExitCode.CONFIG)


def _credentials_missing(job) -> list[str]:
    """A job whose store is a bucket this machine holds no credentials for: a warning,
    not an error (the machine that runs it may have an instance role)."""
    if not job.storage.is_remote:
        return []
    from runner.storage.s3 import credentials_here

    if credentials_here():
        return []
    return ["storage.url is a bucket and this machine has no S3 credentials for it "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE): `run` here "
            "would stop at its first bucket call; a machine with an instance role needs "
            "none (validate there, or here with --no-path-checks)"]


def _to_json(data) -> str:
    """``--json`` output: strict JSON (a NaN loss from a diverged run becomes null, which
    every parser reads; Python's default "NaN" is not JSON)."""
    import math

    def strict(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: strict(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [strict(v) for v in value]
        return value

    return json.dumps(strict(data), indent=2, allow_nan=False)


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

    JOB_FILE may also be an s3:// URL. With resources.gpus > 1 it runs N ranks under
    torchrun and exits with rank 0's code.

    Exit codes: 0 done, 1 crash, 2 config error (also out of memory), 3 data error, 4
    storage error (also a full or read-only disk, or another run holding the run
    directory), 5 the GPU failed the pre-flight check, 9 diverged (the loss stayed
    non-finite: lower train.lr), 10 a GPU that NVML sees and torch cannot use, 75
    stopped by a signal or a preemption notice (everything trained is committed; run
    again to resume)."""
    from ten.train.stop import Interrupted, Stop

    stop = Stop(exit_code=ExitCode.PREEMPTED)
    try:
        stop.install()  # from the first moment: a stop before the loop exits 75 too
        job = _load(job_file, sets)
        from runner.launch.torchrun import launch, needs_launcher

        if needs_launcher(job):  # resources.gpus > 1: this process supervises torchrun
            raise SystemExit(launch(job_file, sets, job, stop, no_sample=no_sample))
        from runner.run.jobrun import run_job

        code = run_job(job, stop, sample_prompt=None if no_sample else "The")
    except Interrupted as stopped:
        stop.handled()
        click.echo(f"stopped by {stopped.name} during {stop.phase}: nothing to save "
                   "yet; run again to resume", err=True)
        code = ExitCode.PREEMPTED
    except MemoryError:  # importing torch, loading the job: the machine, before any run
        click.echo("out of memory before the run could start: this machine (or its "
                   "container's limit) leaves too little for the runner", err=True)
        code = ExitCode.CONFIG
    stop.end_process(code)


@cli.command()
@click.argument("run", metavar="RUN")
@click.option("--job", "job_name", default=None, help="Job name inside a store.")
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint.")
@click.option("--prompt", default="The", show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(0))
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--step", default=None, type=click.IntRange(0),
              help="The checkpoint's step (default: the newest committed).")
def sample(run: str, job_name: str | None, endpoint_url: str | None, prompt: str,
           max_new_tokens: int, temperature: float, top_k: int, seed: int,
           step: int | None) -> None:
    """Generate text from the newest valid checkpoint of RUN: a run directory (e.g.
    runs/tiny-cpu) or a run's name in ./runs (tiny-cpu), a bucket run
    (s3://bucket/prefix/JOB: its newest committed checkpoint and tokenizer are downloaded
    under $TEN_CACHE_DIR/samples), a job file, or a submitted job's id."""
    from runner.trained.sample import sample_run

    where, job_name, endpoint_url = resolve_target(run, job_name, endpoint_url).located()
    click.echo(sample_run(where, prompt, max_new_tokens, temperature, top_k, seed,
                          job=job_name, endpoint_url=endpoint_url, step=step))


@cli.command("export-model")
@click.argument("run", metavar="RUN")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The folder to write (must not exist, or be empty).")
@click.option("--step", default=None, type=click.IntRange(0),
              help="The checkpoint's step (default: the newest committed).")
@click.option("--job", "job_name", default=None, help="Job name inside a store.")
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint.")
@click.option("--push-to-hub", "repo", default=None, metavar="OWNER/NAME",
              help="Then upload the folder to this Hugging Face Hub model repository "
                   "(created if needed; HF_TOKEN from the environment).")
@click.option("--private", is_flag=True, help="With --push-to-hub: a new repository is "
              "private.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out (in "
              "one rename; any other folder is refused).")
def export_model(run: str, out: str, step: int | None, job_name: str | None,
                 endpoint_url: str | None, repo: str | None, private: bool,
                 overwrite: bool) -> None:
    """Write RUN's model as a folder other tools load: safetensors weights, the config,
    the model and tokenizer code for Hugging Face transformers (trust_remote_code=True),
    the run's tokenizer and a model card. The transformer baseline is written as a
    standard StableLM (no model code). RUN is as for `sample`.

    Exit codes: 0 exported, 2 a run or --out that cannot be used, 3 a damaged or foreign
    tokenizer, 4 a full or read-only disk, 75 stopped by a signal (nothing exported)."""
    from runner.trained.hf_folder import export_model as export
    from runner.trained.hf_folder import hub_token, push_to_hub
    from ten.train.stop import Interrupted, Stop

    token = None if repo is None else hub_token(repo)  # before anything is spent
    where, job_name, endpoint_url = resolve_target(run, job_name, endpoint_url).located()
    path = None
    with Stop(exit_code=ExitCode.PREEMPTED).installed() as stop:
        try:
            path = export(where, out, job=job_name, step=step, endpoint_url=endpoint_url,
                          overwrite=overwrite, stop=stop)
            if stop.received is not None:  # during the rename: the folder is complete
                stop.handled()
                if repo is not None:
                    raise Interrupted(stop.received)
            trust = ", trust_remote_code=True" if (path / "modeling_ten.py").exists() else ""
            click.echo(f"exported to {path}; load it with AutoModelForCausalLM"
                       f".from_pretrained({str(path)!r}{trust})")
            if repo is not None:
                click.echo(f"pushed to {push_to_hub(path, repo, token, private=private)}")
        except Interrupted as stopped:
            stop.handled()
            done = (f"{path} is complete; the push to {repo} did not finish" if path
                    else f"nothing was written to {out}; run it again")
            raise UserError(f"stopped by {stopped.name}: {done}",
                            exit_code=ExitCode.PREEMPTED) from None


@cli.command("eval")
@click.argument("target", metavar="RUN|FOLDER")
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Text to score: a plain text file, or JSONL with a \"text\" field.")
@click.option("--seq-len", default=None, type=click.IntRange(1),
              help="The 1x window (default: the model's training length).")
@click.option("--max-tokens", default=MAX_TOKENS, show_default=True, type=click.IntRange(1),
              help="Predicted tokens scored per length, at most.")
@click.option("--step", default=None, type=click.IntRange(0),
              help="A run's checkpoint step (default: the newest committed).")
@click.option("--job", "job_name", default=None, help="Job name inside a store.")
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint.")
@click.option("--per-document", is_flag=True, help="Score each document alone, from an "
              "EOS, every token predicted (lm-evaluation-harness's rolling log-likelihood).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (loss, perplexity, "
              "bits_per_byte at the 1x length, and by_length).")
def eval_command(target: str, data: str, seq_len: int | None, max_tokens: int,
                 step: int | None, job_name: str | None, endpoint_url: str | None,
                 per_document: bool, as_json: bool) -> None:
    """Held-out loss, perplexity and bits per byte of a trained model on any text, at
    its training length and 4x and 16x longer. RUN|FOLDER: a run (as for `sample`) or a
    folder `export-model` wrote."""
    from runner.trained.evaluate import evaluate

    where, job_name, endpoint_url = resolve_target(target, job_name, endpoint_url).located()
    click.echo(evaluate(where, Path(data), seq_len, max_tokens, as_json, per_document,
                        job=job_name, endpoint_url=endpoint_url, step=step))


def _load(job_file: str, sets: tuple[str, ...] = (), check_card: bool = False):
    from runner.job import JobError
    from runner.job.jobfile import load_any

    try:
        return load_any(job_file, sets=sets, check_card=check_card)
    except JobError as err:
        raise UserError("\n".join(err.errors), exit_code=ExitCode.CONFIG) from None


_TARGET = click.argument("target", default=DEFAULT_STORE)
_JOB = click.option("--job", "job_name", default=None, help="Job name inside a store.")
_ENDPOINT = click.option("--endpoint-url", default=None, help="S3-compatible endpoint.")


@cli.command()
@_TARGET
@_JOB
@_ENDPOINT
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON on stdout: a list of heartbeat statuses (each with "
                   "\"stale\"), or for a job id its record as an object.")
def status(target: str, job_name: str | None, endpoint_url: str | None,
           as_json: bool) -> None:
    """Where runs stand, from their heartbeat: TARGET is a job file, a store (./runs,
    s3://bucket/prefix) or a run directory. Works from a laptop while the job runs
    elsewhere; a heartbeat that stopped arriving shows as stale."""
    from runner.monitor.status import format_status_table, read_statuses, status_records

    record = submitted_record(target)
    if record is not None:
        click.echo(_to_json(_submitted_data(record)) if as_json
                   else _describe_submitted(record))
        return
    where, job_name, endpoint_url = resolve_target(target, job_name, endpoint_url).located()
    statuses = read_statuses(where, job_name, endpoint_url)
    if as_json:  # "[]" too, so a script can always parse stdout; the exit code says why
        click.echo(_to_json(status_records(statuses)))
    if not statuses:
        raise UserError(f"no runs with a heartbeat under {where}", exit_code=ExitCode.CONFIG)
    if not as_json:
        click.echo(format_status_table(statuses))


@cli.command("rm")
@click.argument("target")
@_JOB
@_ENDPOINT
@click.option("-y", "--yes", is_flag=True, help="Do not ask: remove.")
@click.option("--force", is_flag=True, help="Remove even a run whose heartbeat is live.")
def rm(target: str, job_name: str | None, endpoint_url: str | None, yes: bool,
       force: bool) -> None:
    """Remove a run: all its files (checkpoints, metrics, logs, status) in its run
    directory or under its name in the bucket; prepared data and other runs stay.
    TARGET: a run directory or its name in ./runs, a store with one run (--job picks one
    of several), s3://bucket/prefix/JOB, a job file or a submitted job's id. Asks first
    (--yes: does not); a run that is training is refused (--force removes it anyway)."""
    from runner.monitor.remove import contents, refuse_if_live, remove
    from runner.monitor.source import open_run

    run = open_run(*resolve_target(target, job_name, endpoint_url).located())
    if not force:
        refuse_if_live(run)
    there = contents(run)
    what = f"{there.files} files, {there.size / 1e6:,.1f} MB, in {there.where}"
    try:
        sure = yes or click.confirm(f"remove {what}?", err=True)
    except click.Abort:  # no answer (no terminal, Ctrl-C, end of input)
        sure = False
    if not sure:
        raise UserError("nothing removed (--yes removes without asking)",
                        exit_code=ExitCode.CONFIG)
    remove(run)
    click.echo(f"removed {what}")


@cli.command()
@_TARGET
@_JOB
@_ENDPOINT
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is appended.")
@click.option("--interval", default=10.0, show_default=True, help="Seconds between polls.")
def logs(target: str, job_name: str | None, endpoint_url: str | None, follow: bool,
         interval: float) -> None:
    """Print a run's log. TARGET: a run directory or its name in ./runs, a store with
    one run (./runs by default; --job picks one of several), s3://bucket/prefix/JOB, a job
    file or a submitted job's id."""
    from runner.monitor.logs import follow_log, read_log
    from runner.monitor.source import open_run

    where, job_name, endpoint_url = resolve_target(target, job_name, endpoint_url).located()
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
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where the PNG and HTML go (default: reports/ in the run's directory; "
                   "./reports for a run in a bucket).")
@click.option("--price-per-hour", type=float, default=None,
              help="USD per machine-hour (default: the job's resources.price_per_hour).")
@click.option("--gpus", type=click.IntRange(1), default=1, show_default=True)
def report(target: str, job_name: str | None, endpoint_url: str | None, out_dir: str | None,
           price_per_hour: float | None, gpus: int) -> None:
    """Plot a run (loss, eval, tokens/s, MFU, GPU, preemptions) and its cost: GPU-hours
    (machine-hours on CPU) paid, goodput, $ per 1B tokens. Writes a PNG and an HTML
    page. TARGET as for logs: a run directory or its name in ./runs, a store with one run
    (./runs by default), s3://bucket/prefix/JOB, a job file or a submitted job's id."""
    from runner.monitor.report import write_report

    t = resolve_target(target, job_name, endpoint_url)
    png, page = write_report(t.where, t.job, out_dir, t.endpoint_url,
                             price_per_hour=price_per_hour, gpus=gpus, scrub=t.scrub)
    click.echo(f"wrote {png}\nwrote {page}")


@cli.command()
@click.argument("job_file", type=click.Path())
@click.option("--to", "target", required=True, metavar=TO_FORMS,
              help=f"Where the job runs: {TO_HELP}.")
@click.option("--wait", is_flag=True,
              help="Supervise in the foreground until the job ends (Ctrl-C hands it to "
                   "a background controller; it never stops the training).")
@click.option("--region", default=None,
              help="The cloud's region: --set resources.<cloud>.region=REGION for a cloud "
                   "whose section has one (aws).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a job key, as for `run` (repeatable); the job submitted is "
                   "the file with these written into it.")
def submit(job_file: str, target: str, wait: bool, region: str | None,
           sets: tuple[str, ...]) -> None:
    """Send a job to a machine and print its job id (for status, logs, cancel).

    Every target is managed: a controller relaunches the job after a preemption (always)
    or a crash (up to resources.max_restarts) until it is done, and tears everything
    down at the end. --to ssh://... checks the host first (ssh, nvidia-smi, docker) and
    runs the job's container there. Secrets travel only in the environment (ssh: a 0600
    env file removed after start; aws: the instance profile), never on a command line or
    in a file we upload."""
    if region is not None:
        sets = (*sets, *_region_setting(target, region))
    job = _load(job_file, sets, check_card=True)

    def say(line: str) -> None:
        click.echo(line, err=True)  # stdout carries only the job id

    from runner.provision.jobs import submit_managed

    record = submit_managed(job, Path(job_file), target, detach=not wait, log=say,
                            sets=sets)
    click.echo(record.job_id)
    if wait and record.state in ("FAILED", "CANCELLED"):
        raise SystemExit(record.exit_code or int(ExitCode.CRASH))


def _region_setting(target: str, region: str) -> tuple[str, ...]:
    """``--region R`` as the ``--set`` it stands for, for the cloud ``target`` names;
    a usage error (exit 2) where that cloud takes no region."""
    cloud = cloud_of(target)
    if cloud is None:  # no cloud of that name: submit says which --to forms there are
        return ()
    if not cloud.has_key("region"):
        with_regions = [c.name for c in CLOUDS if c.has_key("region")]
        raise click.UsageError(f"--region: --to {target} takes no region (clouds with one: "
                               f"{', '.join(with_regions)})")
    return (f"resources.{cloud.name}.region={region}",)


@cli.command()
@click.option("--json", "as_json", is_flag=True,
              help="Print the records as a JSON list on stdout (\"[]\" when none).")
def jobs(as_json: bool) -> None:
    """List the jobs submitted from this machine."""
    import time
    from dataclasses import asdict

    from runner.provision.registry import home, list_records

    records = list_records()
    if as_json:
        click.echo(_to_json([asdict(r) for r in records]))
        return
    if not records:
        click.echo(f"no submitted jobs under {home()}/jobs")
        return
    from ten.text import table

    click.echo(table(("JOB ID", "TARGET", "STATE", "ATTEMPTS", "UPDATED"), [
        (r.job_id, r.target, r.state, str(r.attempt),
         time.strftime("%Y-%m-%d %H:%M", time.localtime(r.updated))) for r in records],
        right={3}))


@cli.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Stop a submitted job: the trainer gets SIGTERM, commits a checkpoint of its
    current step, and everything launched for the job is torn down."""
    from runner.provision.jobs import request_cancel

    record = request_cancel(job_id)
    click.echo(f"{job_id}: {record.state}")


def _describe_submitted(record) -> str:
    from runner.provision.jobs import describe, read_heartbeat

    return describe(record, read_heartbeat(record))


def _submitted_data(record) -> dict:
    """``status JOB_ID --json``: what :func:`_describe_submitted` prints, as data."""
    from runner.provision.jobs import describe_data, read_heartbeat

    return describe_data(record, read_heartbeat(record))


@cli.command("export")
@click.argument("job_file", type=click.Path())
@click.option("--to", "target", required=True, type=click.Choice(["skypilot", "k8s"]),
              help="SkyPilot managed-job task, or Kubernetes Job + ConfigMap.")
@click.option("--job-url", default=None, metavar="s3://...",
              help="Run the job file from this bucket URL instead of embedding it.")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Write here instead of stdout.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a job key, as for `run` (repeatable); the job embedded is the "
                   "file with these written into it.")
def export(job_file: str, target: str, job_url: str | None, output: str | None,
           sets: tuple[str, ...]) -> None:
    """Print a SkyPilot task or a Kubernetes manifest that runs this job in the image.
    The job file travels as written (${VAR} unresolved); secrets appear only by name."""
    from runner.provision.manifests import export_job, laptop_values

    job = _load(job_file, sets, check_card=True)
    text = export_job(job, Path(job_file), target, job_url=job_url, sets=sets)
    for warning in laptop_values(job, target):
        click.echo(f"warning: {warning}", err=True)
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


def _register_extra_commands() -> None:
    from runner.monitor.liveness import healthcheck  # click + stdlib only

    cli.add_command(healthcheck)


_register_extra_commands()


def main() -> None:
    import gc

    from runner.run.log import keep_standard_streams

    keep_standard_streams()
    try:
        cli()
    finally:
        # Out of the exit's last collection: every object still alive (torch's, and
        # torch._dynamo's, which the optimizer imports) is freed with the process anyway,
        # and walking them cost ~0.8 s per command. atexit handlers run as before.
        gc.freeze()


if __name__ == "__main__":
    main()
