"""Shared by every test folder: the seed, the healthcheck pointer, the gpu marker, a
small full disk, and (from tests/support/sandbox.py) the S3 servers, fake AWS and the
corpus. tests/support is put on sys.path here, so its helpers (runhelpers, fakeaws,
sandbox, fakessh) import by name from any folder."""

import os
import sys
from pathlib import Path

# Under `pytest -n N` every worker is a process of its own: one thread each for torch
# (and the runs they start), or N workers x the cores' threads fight over the cores
# (the inner loop: 4 min 23 s on 2 cores, 3 min 30 s with this). Set before torch loads.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's C++ builds in the test's own process, not a pool of compile workers
# that each import torch first: on 2 cores the compile test took 47 s alone, 15 s so
# (the code compiled is the same). The runs and benchmarks the tests start inherit it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "support"))

from fakessh import host  # noqa: E402, F401 - the sandbox ssh host fixture
from sandbox import (  # noqa: E402, F401 - fixtures, registered by being imported here
    aws_env,
    corpus,
    moto_aws,
    moto_aws_server,
    moto_endpoint,
    moto_server,
    rclone_endpoint,
    rclone_server,
    s3_store,
    store,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _healthcheck_pointer(tmp_path_factory):
    """Runs started by the tests point the container healthcheck at their heartbeat;
    keep that pointer out of the developer's ~/.cache (subprocesses inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEN_HEARTBEAT_POINTER",
                  str(tmp_path_factory.mktemp("healthcheck") / "heartbeat-pointer"))
        yield


def pytest_addoption(parser):
    parser.addoption("--image", action="store_true",
                     help="also build the Dockerfile and run its image (tests/image: root, "
                          "buildah, debootstrap, ~6 GB and minutes; .ci/run does)")
    parser.addoption("--device-recipe", action="store_true",
                     help="also check the device recipe on the CPU: the GPU suite's smoke "
                          "run and every Triton kernel compiled for the L40S and the H100 "
                          "(~5 CPU-minutes; .ci/run does)")


@pytest.hookimpl(trylast=True)  # after tests/e2e/conftest.py has marked its tests slow
def pytest_collection_modifyitems(config, items):
    """Without CUDA the gpu tests are skipped, without ``--image`` the image tests, and
    without ``--device-recipe`` the device recipe's checks (a fifth of the whole suite's
    CPU time; CI runs them after the suite, as it runs the image's).
    The slow tests go first: the minute-long ones start early and the short ones fill
    the gaps at the end, instead of one long test running alone after everything else.
    They stay together, in the first worker's share of xdist's work stealing, the others
    taking them from its end as they run out: dealt to every worker's front instead, the
    suite took 14:58, not 11:57 (3 workers, 2 cores): whole runs side by side cost ~25%
    more CPU each, and a module's fixture (the GPU suite's smoke, 3 minutes) ran once on
    each worker its tests went to."""
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA device")
    if not config.getoption("--image"):
        skips["image"] = pytest.mark.skip(reason="builds and runs the image: with --image "
                                                 "(CI runs it as a step of .ci/run)")
    if not config.getoption("--device-recipe"):
        skips["device_recipe"] = pytest.mark.skip(reason="checks the device recipe: with "
                                                         "--device-recipe (CI runs it as a "
                                                         "step of .ci/run)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
    items.sort(key=lambda item: "slow" not in item.keywords)


@pytest.hookimpl(optionalhook=True)  # the lent GPUs' image has no pytest-xdist
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker more than the cores. The whole runs spend seconds waiting
    on their processes, servers and signals; with one worker a core the 2-core machine
    was busy 86% of the suite (1,377 CPU-s in 801 s), with three 89-92% (BENCHMARKS.md)."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.fixture
def small_disk(tmp_path):
    """A factory for a real, nearly full file system: ``small_disk(kib)`` mounts a tmpfs of
    that size and returns its path (unmounted after the test). Writes past the size fail
    with ENOSPC, as on a full disk. Needs root (CI and the dev machines run as root)."""
    import subprocess

    mounted = []

    def make(kib: int):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root")
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tf32_off():
    """torch's TF32 switches off for the test and put back after it by assignment. Not
    ``monkeypatch.setattr``: torch's backend modules answer these through ``__getattr__``,
    so pytest >= 9.2 finds nothing to restore and deletes them at teardown (an error)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    yield
    matmul.allow_tf32, cudnn.allow_tf32 = saved
