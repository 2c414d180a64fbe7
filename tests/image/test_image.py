"""The image as users run it (issue 43): the Dockerfile built here and run as ``docker
run`` runs it, as the image's user under tini (tests/support/oci.py: what stands in for
the daemon and the registry). Skipped without ``--image``; CI runs these as a step of
.ci/run, which installs buildah and debootstrap."""

import os
import signal
import uuid

import oci
import pytest
from patience import communicate
from runhelpers import final_weights, losses, same_weights, wait_for_step

from runner.exit_codes import ExitCode
from runner.storage import StoreURL, open_store
from runner.storage.checkpoints import latest_committed

pytestmark = [pytest.mark.slow, pytest.mark.image]

BUCKET = "ten-test"  # made by the rclone fixture


@pytest.fixture(scope="module")
def image():
    why = oci.missing()
    if why is not None:  # asked for with --image: a machine that cannot is a failure
        pytest.fail(f"the image check {why}")
    print(f"image {oci.IMAGE} built in {oci.build():.0f}s")
    return oci.config()


@pytest.fixture
def containers(tmp_path):
    """``containers(volume)``: a new container of the image whose /cache is the host
    folder ``tmp_path/volume`` (the same name: the same volume). Removed after the test,
    their processes killed."""
    made = []

    def make(volume: str) -> oci.Container:
        made.append(oci.Container(tmp_path / volume))
        return made[-1]

    yield make
    for box in made:
        box.remove()


def test_the_default_job_runs_to_the_end_as_the_images_user(image, containers):
    """``docker run -v ten-cache:/cache IMAGE run jobs/tiny-cpu.yaml``, as the README
    says: the whole default job, its held-out perplexity and sample, as uid 10001."""
    assert image["User"] == f"{oci.IMAGE_UID}:{oci.IMAGE_UID}"
    box = containers("cache")
    proc = box.start("run", "jobs/tiny-cpu.yaml")
    _, err = communicate(proc, 300)
    assert proc.returncode == ExitCode.OK, err[-3000:]
    assert "done: 300 steps" in err and "perplexity" in err and "sample: " in err
    written = [p for p in box.cache.rglob("*")]
    assert written and {p.stat().st_uid for p in written} == {oci.IMAGE_UID}  # not root


def test_sigterm_to_pid_1_commits_and_fresh_containers_resume_bit_exactly(
        image, containers, rclone_endpoint):
    """The spot life in the image, checkpoints in an S3 server on 127.0.0.1: SIGTERM to
    tini (``docker stop``) -> exit 75 with the step in the bucket; a fresh container on
    the same volume carries on, is stopped again; a container on a new volume (a new
    machine) restores from the bucket and finishes. The healthcheck answers healthy
    during the run, and the losses and weights equal an uninterrupted run's."""
    env = {name: os.environ[name] for name in
           ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}

    def job(prefix: str) -> tuple[list[str], str]:
        url = f"s3://{BUCKET}/{prefix}-{uuid.uuid4().hex[:8]}"
        # every step's loss logged: a logged loss is the mean since the last line, and a
        # resumed run's first window starts at its resume
        args = ["run", "jobs/tiny-cpu.yaml", "--no-sample", "--set", "train.max_steps=30",
                "--set", "train.log_every=1", "--set", "checkpoint.every_steps=10",
                "--set", f"storage.url={url}", "--set", f"storage.endpoint_url={rclone_endpoint}"]
        return args, url

    def run_dir(box: oci.Container, url: str):
        return box.cache / "ten" / "runs" / StoreURL.parse(url).key(rclone_endpoint) / "tiny-cpu"

    def stop_at(box: oci.Container, args: list[str], url: str, step: int) -> int:
        proc = box.start(*args, env=env)
        try:
            wait_for_step(run_dir(box, url) / "metrics.jsonl", proc, step, timeout=300)
            health = box.exec("ten-runner", "healthcheck")
            assert health.returncode == 0 and "healthy" in health.stdout, health
            os.kill(box.tini(proc), signal.SIGTERM)
            _, err = communicate(proc, 120)
        finally:
            if proc.poll() is None:
                box.kill(proc)
        assert proc.returncode == ExitCode.PREEMPTED, err[-3000:]
        stopped = max(losses(run_dir(box, url)))
        assert latest_committed(open_store(url, endpoint_url=rclone_endpoint),
                                "tiny-cpu") == stopped, err[-3000:]
        return stopped

    args, url = job("spot")
    first = stop_at(containers("a"), args, url, 5)
    second = stop_at(containers("a"), args, url, first + 5)  # same volume, new container
    assert first < second < 30

    box = containers("b")  # a new machine: nothing on its disk
    proc = box.start(*args, env=env)
    _, err = communicate(proc, 300)
    assert proc.returncode == ExitCode.OK, err[-3000:]
    assert f"restored step {second} from" in err

    ref_args, ref_url = job("ref")
    ref = containers("ref")
    proc = ref.start(*ref_args, env=env)
    _, ref_err = communicate(proc, 300)
    assert proc.returncode == ExitCode.OK, ref_err[-3000:]
    resumed, uninterrupted = run_dir(box, url), run_dir(ref, ref_url)
    assert losses(resumed) == losses(uninterrupted)
    (s1, w1), (s2, w2) = final_weights(resumed), final_weights(uninterrupted)
    assert s1 == s2 == 30 and same_weights(w1, w2)
