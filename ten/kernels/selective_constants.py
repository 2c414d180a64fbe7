"""Selective mode's constants, read by its operator (``ten.kernels.selective``) and by its
Triton kernels (``ten.kernels.selective_kernels``) alike. No torch."""

import math

# Δ_t = softplus(z_t) / STEP_UNIT, with z's bias starting at softplus⁻¹(STEP_UNIT): the step
# starts at 1 (the fixed model) but in softplus's exponential part, where each unit of z
# multiplies it by e (Mamba starts its steps at 0.001-0.1 for this reason). Holding and
# overwriting are then a few units of z away; at Δ = 1 on softplus's linear part, an
# eigenstate with |λ| = 0.999 needed z ~ 1000 to overwrite.
STEP_UNIT = 0.01
DELTA_BIAS = math.log(math.expm1(STEP_UNIT))
MIN_WRITE = 1e-24  # 1 - |λ|² is floored here: a step that underflows to 0 gives no NaN
