"""Getting a job onto a machine: ``ten-runner submit`` to this machine, an ssh host or an
EC2 spot instance, the managed relaunch loop, and export to SkyPilot/Kubernetes.

Layout: :mod:`.base` (the provider interface and errors), :mod:`.destinations` (which
module serves a ``--to`` target), :mod:`.registry` (submitted jobs on this machine),
:mod:`.policy` (the pure relaunch decisions), :mod:`.managed` (the loop), one module per
provider. See runner/README.md for the state machine and how to add a cloud.
"""
