"""The configuration of a Temporal Eigenstate Network language model, as exported by
ten-runner (``ten-runner export-model``)."""

from transformers import PretrainedConfig


class TENConfig(PretrainedConfig):
    """The shape of a TEN model. ``selective``: input-dependent eigenvalue steps;
    ``conv_width``: a causal depthwise convolution before the drive (0: none);
    ``mlp``: "swiglu" or "gelu"; ``chunk_size``: the scan's chunk length (speed only)."""

    model_type = "ten"

    def __init__(self, vocab_size=4096, d_model=128, n_layers=4, n_eigenstates=64,
                 n_heads=4, mlp="swiglu", mlp_hidden=384, selective=True, conv_width=4,
                 norm_eps=1e-5, chunk_size=64, seq_len=256, state="vector", value_dim=None,
                 tie_word_embeddings=True, **kwargs):
        self.vocab_size, self.d_model, self.n_layers = vocab_size, d_model, n_layers
        self.n_eigenstates, self.n_heads = n_eigenstates, n_heads
        self.mlp, self.mlp_hidden = mlp, mlp_hidden
        self.selective, self.conv_width = selective, conv_width
        self.norm_eps, self.chunk_size, self.seq_len = norm_eps, chunk_size, seq_len
        self.state = state  # what an eigenstate holds: "vector", or "matrix" (value vectors)
        self.value_dim = value_dim or d_model // n_heads  # a matrix state's per head
        # the names other tools look for
        self.hidden_size, self.num_hidden_layers = d_model, n_layers
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
