"""The files ``ten-runner export-model`` copies into an exported model's folder, for the
Hugging Face ``transformers`` convention (loaded with ``trust_remote_code=True``). They
import torch, transformers and sentencepiece only: whoever loads the folder has no
``ten`` and no ``runner``. The runner itself never imports them; ``layouts.py`` (the
runner's, not copied) says how each model class maps onto transformers."""
