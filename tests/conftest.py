import pytest
import torch


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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
