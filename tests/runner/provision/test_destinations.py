"""Which module serves a ``--to`` target (runner.provision.destinations), and that adding
a cloud is its declaration and its destination: a destination written here, declared,
runs a managed job with nothing else changed (the declaration's own module, its job
section and help: tests/runner/job/test_clouds.py)."""

import sys

import pytest
from fakecloud import FakeCloud, Script, exited

from runner.job import clouds
from runner.job.clouds import Cloud
from runner.provision.base import ProvisionError
from runner.provision.destinations import Destination, destination


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("target,module", [
    ("local", "runner.provision.local"), ("aws", "runner.provision.aws"),
    ("ssh://ubuntu@gpu-box:2222", "runner.provision.ssh"),
    ("SSH://ubuntu@gpu-box", "runner.provision.ssh")])
def test_each_target_is_served_by_its_module(target, module):
    found = destination(target)
    assert isinstance(found, Destination) and type(found).__module__ == module


@pytest.mark.parametrize("target", ["gcp", "ssh", "local://x", "aws://eu-west-1", ""])
def test_an_unknown_target_names_the_forms(target):
    with pytest.raises(ProvisionError, match="use local, aws or ssh://user@host"):
        destination(target)


def test_a_declared_cloud_runs_a_managed_job_with_nothing_else_changed(tmp_path, corpus,
                                                                       monkeypatch):
    from runhelpers import write_job

    from runner.job import load_job
    from runner.provision.jobs import submit_managed

    cloud = FakeCloud([Script.runs(1, exited(0))])
    (tmp_path / "mycloud.py").write_text(
        "from runner.provision.destinations import Destination\n"
        "class MyCloud(Destination):\n"
        "    def stage(self, job, job_copy, job_id, *, check):\n"
        "        return {'staged': job_id}\n"
        "    def provider(self, record, job, log):\n"
        "        return CLOUD\n"
        "DESTINATION = MyCloud()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = Cloud("mycloud", form="mycloud", summary="a test's", destination="mycloud")
    monkeypatch.setattr(clouds, "CLOUDS", (*clouds.CLOUDS, declared))  # what cloud_of reads
    import mycloud
    monkeypatch.setattr(mycloud, "CLOUD", cloud, raising=False)

    path = write_job(tmp_path, corpus, name="elsewhere")
    record = submit_managed(load_job(path, check_model=False), path, "mycloud",
                            detach=False, poll_s=0.001, log=lambda line: None)
    assert record.state == "SUCCEEDED" and record.target == "mycloud"
    assert record.details["staged"] == record.job_id and len(cloud.launches) == 1
    cloud.assert_clean()
    sys.modules.pop("mycloud", None)
