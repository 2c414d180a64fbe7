"""A job on several GPUs or machines: :mod:`.torchrun` (the launcher around torchrun and
the one exit code it returns, ``python -m runner.launch.torchrun``) and :mod:`.ranks`
(what only rank 0 decides and every rank agrees on: the checkpoint, the exit code).
"""
