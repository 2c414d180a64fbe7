"""A trained run's model, after training: text from it (``sample``), its score on any
text (``evaluate``), and a folder other tools load (``export``: safetensors and the
Hugging Face transformers convention, the files that travel with it in ``hf_model/``)."""

# Predicted tokens ``ten-runner eval`` scores per length by default (``--max-tokens``), and
# the length an exported TEN names as its max_position_embeddings (a TEN has no position
# limit, but tools size their windows by it): so eval and lm-evaluation-harness score the
# same windows.
MAX_TOKENS = 65536
