"""The multi-GPU launcher's decisions (runner.launch.torchrun): when a job needs torchrun, the
rendezvous flags from TEN_NNODES & co., and one line for each bad setting. Two ranks
for real, signals and kill -9: tests/e2e/test_launch_ranks.py."""

import pytest
from runhelpers import write_job

from runner.errors import UserError
from runner.job import load_job
from runner.launch.torchrun import Nodes, needs_launcher, nodes_from_env, torchrun_command


def test_only_several_gpus_or_machines_outside_torchrun_need_the_launcher(tmp_path, corpus):
    two = load_job(write_job(tmp_path, corpus, name="two", gpus=2))
    one = load_job(write_job(tmp_path, corpus, name="one", gpus=1))
    assert needs_launcher(two, env={})
    assert not needs_launcher(one, env={})
    assert not needs_launcher(load_job(write_job(tmp_path, corpus)), env={})
    assert not needs_launcher(two, env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert needs_launcher(one, env={"TEN_NNODES": "2"})  # gpus count one machine's


def test_node_settings_become_torchrun_rendezvous_flags():
    assert nodes_from_env({}) is None
    assert nodes_from_env({"TEN_NNODES": "1"}) is None
    nodes = nodes_from_env({"TEN_NNODES": "2", "TEN_NODE_RANK": "1",
                            "TEN_MASTER_ADDR": "10.0.0.5", "TEN_MASTER_PORT": "29555"})
    assert nodes == Nodes(2, 1, "10.0.0.5", 29555)
    cmd = torchrun_command("job.yaml", ("train.lr=1e-3",), 4, nodes, no_sample=True)
    flags = " ".join(cmd[1:])
    assert ("--nproc_per_node 4" in flags and "--nnodes 2 --node_rank 1 --master_addr "
            "10.0.0.5 --master_port 29555" in flags and "--standalone" not in flags)
    assert cmd[-6:] == ["runner.cli", "run", "job.yaml", "--set", "train.lr=1e-3", "--no-sample"]
    assert "--standalone" in torchrun_command("job.yaml", (), 2, None)
    assert nodes_from_env({"TEN_NNODES": "2", "TEN_NODE_RANK": "0",
                           "TEN_MASTER_ADDR": "h"}).master_port == 29500


@pytest.mark.parametrize("env, words", [
    ({"TEN_NODE_RANK": "1"}, "TEN_NNODES"),
    ({"TEN_NNODES": "two"}, "TEN_NNODES='two'"),
    ({"TEN_NNODES": "2", "TEN_MASTER_ADDR": "h"}, "TEN_NODE_RANK"),
    ({"TEN_NNODES": "2", "TEN_NODE_RANK": "2", "TEN_MASTER_ADDR": "h"}, "between 0 and 1"),
    ({"TEN_NNODES": "2", "TEN_NODE_RANK": "0", "TEN_MASTER_ADDR": "h",
      "TEN_MASTER_PORT": "70000"}, "TEN_MASTER_PORT"),
])
def test_bad_node_settings_name_the_variable(env, words):
    with pytest.raises(UserError, match=words):
        nodes_from_env(env)
