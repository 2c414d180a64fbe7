"""Two machines (two launchers on this one, each with its own disk: its own cache_dir)
of one rank each, static rendezvous through TEN_NNODES & co., checkpoints in a bucket:
the preemption of the second machine stops both, and two new machines resume."""

import os
import shutil
import signal
import sys
import uuid

import pytest
from patience import communicate
from runhelpers import Launched, final_weights, losses, run_to_end, wait_for_step, write_job
from sandbox import free_port

from runner.exit_codes import ExitCode
from runner.storage.checkpoints import latest_committed

from .test_run_bucket import bucket_job

STEPS = 16


@pytest.fixture
def launch():
    """Starts ``ten-runner`` like runhelpers.cli; kills what a failed test leaves."""
    launched = Launched()
    yield launched
    launched.kill_all()


def start_nodes(launch, job, tmp_path, port):
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "TEN_NNODES": "2", "TEN_NODE_RANK": str(rank),
               "TEN_MASTER_ADDR": "127.0.0.1", "TEN_MASTER_PORT": str(port)}
        procs.append(launch("run", job, "--no-sample", "--set",
                         f"data.cache_dir={tmp_path / f'node{rank}'}", env=env))
    return procs


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher is Linux's")
def test_two_machines_stop_together_and_resume_from_the_bucket(tmp_path, corpus,
                                                               moto_endpoint, launch):
    one = write_job(tmp_path, corpus, name="one", steps=STEPS, batch=8)
    code, _, err = run_to_end("run", one, "--no-sample")
    assert code == 0, err
    name = f"nodes-{uuid.uuid4().hex[:6]}"
    job, store, working = bucket_job(tmp_path, corpus, moto_endpoint, name, steps=STEPS,
                                     batch=4, gpus=1, every=100)
    local = [tmp_path / f"node{r}" / "runs" / working.parent.name / name for r in (0, 1)]

    procs = start_nodes(launch, job, tmp_path, free_port())
    wait_for_step(local[0] / "metrics.jsonl", procs[0], 4)
    procs[1].send_signal(signal.SIGTERM)  # only the second machine is reclaimed
    errs = [communicate(p, 120)[1] for p in procs]
    assert [p.returncode for p in procs] == [ExitCode.PREEMPTED] * 2, errs[1][-3000:]
    step = max(losses(local[0]))
    assert latest_committed(store, name) == step
    assert not (local[1] / "checkpoints").exists()  # only rank 0 writes checkpoints
    for d in local:
        shutil.rmtree(d, ignore_errors=True)  # two new machines

    procs = start_nodes(launch, job, tmp_path, free_port())
    errs = [communicate(p, 300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert f"restored step {step} from" in errs[0]
    assert f"step {step} from s3://" in errs[1] and "resumed from" in errs[1]
    a, b = losses(local[0]), losses(tmp_path / "store" / "one")
    assert a.keys() == b.keys() and max(abs(a[s] - b[s]) for s in a) < 1e-4
    assert final_weights(local[0])[0] == STEPS and latest_committed(store, name) == STEPS
