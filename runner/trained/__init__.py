"""A trained run's model, after training: text from it (``sample``), its score on any
text (``evaluate``), and a folder other tools load (``export``: safetensors and the
Hugging Face transformers convention, the files that travel with it in ``hf_model/``)."""
