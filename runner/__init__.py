"""runner: job YAML, CLI, object storage, GPU monitoring and provisioning around ``ten``.

``runner`` may import ``ten``; ``ten`` never imports ``runner``. Importing the CLI must
not import torch, so ``ten-runner --help`` stays fast.
"""

__version__ = "0.1.0"
