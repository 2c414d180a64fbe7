"""ten: the training library for Temporal Eigenstate Network language models.

Pure library: imports torch, numpy, sentencepiece, datasets and the standard library
only. It never imports ``runner``, click, boto3 or pynvml (a test enforces this).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``ten.load_run``: a trained run's model and tokenizer, imported (with torch) only
    when asked for."""
    if name in ("load_run", "TrainedRun"):
        from ten.train import trainstate

        return getattr(trainstate, name)
    raise AttributeError(f"module 'ten' has no attribute {name!r}")
