"""Two ranks under torchrun with the checkpoints in a bucket (moto): rank 0 alone talks
to the bucket, and rank 1 must load the checkpoint that rank 0 restores from it."""

import shutil
import signal
import sys
import uuid

import pytest
from patience import communicate
from runhelpers import Launched, final_weights, losses, run_to_end, wait_for_step, write_job

from runner.exit_codes import ExitCode
from runner.storage.checkpoints import latest_committed

from .test_run_bucket import bucket_job

STEPS = 24


@pytest.fixture
def launch():
    """Starts ``ten-runner`` like runhelpers.cli; kills what a failed test leaves."""
    launched = Launched()
    yield launched
    launched.kill_all()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher is Linux's")
def test_two_ranks_stop_commit_to_the_bucket_and_resume_on_a_new_machine(
        tmp_path, corpus, moto_endpoint, launch):
    one = write_job(tmp_path, corpus, name="one", steps=STEPS, batch=8)
    code, _, err = run_to_end("run", one, "--no-sample")
    assert code == 0, err
    name = f"ddp-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name, steps=STEPS,
                                   batch=4, gpus=2, every=100)
    proc = launch("run", job, "--no-sample")
    wait_for_step(local / "metrics.jsonl", proc, 5)
    proc.send_signal(signal.SIGTERM)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.PREEMPTED, err[-3000:]
    step = max(losses(local))
    assert latest_committed(store, name) == step  # in the bucket before the launcher exits
    shutil.rmtree(local)  # a new machine: only the bucket has the checkpoint

    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err[-3000:]
    assert f"restored step {step} from" in err
    # Rank 1 waits for the restore before it goes on (to open the data): not just until
    # the process group forms, which times out after 10 minutes with NCCL.
    assert err.index(f"restored step {step} from") < err.index("data ready in")
    assert err.count(f"resumed from {local / 'checkpoints'}") == 2  # both ranks
    a, b = losses(local), losses(tmp_path / "store" / "one")
    assert a.keys() == b.keys() and max(abs(a[s] - b[s]) for s in a) < 1e-4
    assert final_weights(local)[0] == STEPS and latest_committed(store, name) == STEPS
