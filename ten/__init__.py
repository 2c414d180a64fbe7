"""ten: the training library for Temporal Eigenstate Network language models.

Pure library: imports torch, numpy, sentencepiece, datasets and the standard library
only. It never imports ``runner``, click, boto3 or pynvml (a test enforces this).
"""

__version__ = "0.1.0"
