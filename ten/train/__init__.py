"""Training a model: the ``trainer`` (its loop), one ``step``, what survives a restart
(``trainstate``) and its files on disk (``checkpoint``), the process's ``stop``, the
non-finite guard, the sequence-length warm-up, the lr ``schedule``, the 8-bit optimizer,
how a run computes on its device (``execution``), the memory estimate, MFU, ``metrics``,
the ``progress`` line, and DDP (``distributed``).

The top of the library: it builds on ``ten.model``, ``ten.kernels`` and ``ten.data``.
Importing this package imports no torch.
"""
