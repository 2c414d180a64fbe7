"""The model's operators, each beside its reference: the eigenstate scan (``scan``: the
torch backends and the dispatch; ``scan_fused``: Triton), selective mode's eigenvalues and
drive (``selective`` + ``selective_kernels``), the blocks' LayerNorm, SwiGLU, gate and
causal convolution (``block_fused`` + ``block_kernels``), the loss without B×T×V logits
(``loss`` + ``loss_fused``), and how an operator is registered with torch (``ops``).

A ``*_kernels`` / ``*_fused`` module holds Triton code and is imported only where CUDA
(or Triton's interpreter, in the tests) runs it. Nothing here imports the model or the
trainer; importing this package imports no torch.
"""
