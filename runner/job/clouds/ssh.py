"""A host reached by ssh that runs Docker: ``submit --to ssh://user@host[:port]``
(runner/provision/ssh.py). No keys of its own: the target names the host."""

from runner.job.clouds import Cloud

CLOUD = Cloud("ssh", form="ssh://user@host[:port]", summary="an ssh host with docker",
              destination="runner.provision.ssh", order=2)
