"""The language models: their configs (``config``: no torch), the TEN layers (``ten``),
the transformer baseline (``transformer``), what both share (``lm``, ``mlp``), the named
presets and building a model from a config (``presets``), and what can be read off a
model's state (``probes``, ``statehealth``).

Builds on ``ten.kernels``; knows nothing of training. Importing this package imports no
torch.
"""
