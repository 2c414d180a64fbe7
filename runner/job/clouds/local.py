"""This machine: ``submit --to local`` runs the job's container here, under the managed
loop (runner/provision/local.py). No keys of its own."""

from runner.job.clouds import Cloud

CLOUD = Cloud("local", form="local", summary="this machine",
              destination="runner.provision.local", order=0)
