"""Named model sizes, and the transformer baseline matched to each.

Parameter counts and FLOPs are computed by building the model on the ``meta`` device
(no memory, no init cost), never written by hand. ``python -m ten.model.presets`` prints the
table; ``ten-runner presets`` prints the same.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import torch

from ten.config import PRESET_NAMES, UnknownFieldError
from ten.model.config import ARCHS, LMConfig, TENConfig, TransformerConfig
from ten.model.lm import LanguageModel
from ten.model.ten import TENLM, scan_decided
from ten.model.transformer import TransformerLM
from ten.text import table

# chunk_size 64 everywhere. Measured (benchmarks/bench_scan.py, chunked forward+backward,
# 2 CPU cores, fixed eigenvalues, B=1, T=4096, K=128): Q = 16/32/64/128/256 take
# 32/36/47/101/551 ms; bytes and FLOPs grow with Q and accuracy does not. 64 rather than
# the CPU's best keeps the (2Q)² tiles tensor-core sized for chunked runs on a GPU; there
# `auto` picks the fused scan, which has no chunks. The GPU suite's `chunk` section
# re-measures Q = 32..256.
# Every preset is selective with conv_width 4: TENConfig's defaults (measured there).

PRESETS: dict[str, TENConfig] = {
    # CPU/CI: a few steps per second on 2 cores.
    "tiny": TENConfig(vocab_size=4096, d_model=128, n_layers=4, n_eigenstates=64, n_heads=4,
                      seq_len=256, chunk_size=64),
    "small": TENConfig(vocab_size=32000, d_model=768, n_layers=12, n_eigenstates=128,
                       n_heads=4, seq_len=4096, chunk_size=64),
    "small_32k": TENConfig(vocab_size=32000, d_model=1024, n_layers=8, n_eigenstates=128,
                           n_heads=4, seq_len=32768, chunk_size=64),
    "medium": TENConfig(vocab_size=32000, d_model=1536, n_layers=16, n_eigenstates=192,
                        n_heads=6, seq_len=16384, chunk_size=64),
    "large": TENConfig(vocab_size=32000, d_model=2048, n_layers=24, n_eigenstates=256,
                       n_heads=8, seq_len=32768, chunk_size=64),
}

if tuple(PRESETS) != PRESET_NAMES:  # the torch-free name list the job schema accepts
    raise ImportError(f"ten.config.PRESET_NAMES {PRESET_NAMES} != ten.model.presets.PRESETS")

# Model fields that change how the model computes, not what: the chunked scan is exact for
# any chunk size, the backends agree, checkpointing recomputes the same activations, and the
# residual stream's dtype and float8 GEMMs (the head's too) change only their rounding. A
# resume may change them (unlike d_model, say).
EXECUTION_FIELDS = frozenset({"chunk_size", "scan_backend", "grad_checkpointing",
                              "checkpoint_blocks", "residual_dtype", "fp8",
                              "fp8_head"})
# Fields read only when the weights are made: a model started from trained weights
# (TrainConfig.init_from) replaces what they chose.
INIT_FIELDS = frozenset({"init_std", "lambda_min", "lambda_max", "theta_max", "gate_bias"})

# Fields both architectures have: an override of one of these shapes the TEN reference
# *and* the transformer matched to it.
_SHARED = {f.name for f in dataclasses.fields(LMConfig)}
_TEN_FIELDS = {f.name for f in dataclasses.fields(TENConfig)}
_TRANSFORMER_FIELDS = {f.name for f in dataclasses.fields(TransformerConfig)}


def _unknown(kind: str, name: str, known: set[str] | list[str]) -> ValueError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    message = f"unknown {kind} {name!r}{hint}; known: {', '.join(sorted(known))}"
    if kind.endswith("field"):  # a model override: the job layer points at model.<name>
        return UnknownFieldError(name, message)
    return ValueError(message)


def ten_config(preset: str, **overrides: Any) -> TENConfig:
    """The named TEN preset with any field overridden."""
    if preset not in PRESETS:
        raise _unknown("preset", preset, list(PRESETS))
    for name in overrides:
        if name not in _TEN_FIELDS:
            raise _unknown("TEN model field", name, _TEN_FIELDS)
    return dataclasses.replace(PRESETS[preset], **overrides)


def transformer_config(preset: str, mlp_multiple: int = 1,
                       **overrides: Any) -> TransformerConfig:
    """A transformer with the TEN preset's width, depth and vocabulary, and its MLP
    width chosen so the total parameter count matches the TEN model's: the nearest
    multiple of ``mlp_multiple`` (64 keeps a GPU's matmul tiles full, within ~1% of the
    count at GPU sizes; 1: the exact match).

    Overrides of shared or TEN-only fields change the TEN model being matched;
    transformer-only fields (n_heads, pos, mlp_hidden, ...) apply to the result.
    Giving ``mlp_hidden`` turns the matching off.
    """
    for name in overrides:
        if name not in _TEN_FIELDS | _TRANSFORMER_FIELDS:
            raise _unknown("model field", name, _TEN_FIELDS | _TRANSFORMER_FIELDS)
    own = {k: v for k, v in overrides.items() if k in _TRANSFORMER_FIELDS and k not in _SHARED}
    ten = ten_config(preset, **{k: v for k, v in overrides.items() if k in _TEN_FIELDS
                                and k not in own})
    shared = {k: getattr(ten, k) for k in _SHARED}
    base = TransformerConfig(**shared, n_heads=max(1, ten.d_model // 64), mlp_hidden=64)
    base = dataclasses.replace(base, **own)
    if "mlp_hidden" in own:
        return base
    # Parameters are affine in mlp_hidden: solve for the TEN model's count.
    target = count_params(TENLM, ten)
    n64 = count_params(TransformerLM, base)
    n128 = count_params(TransformerLM, dataclasses.replace(base, mlp_hidden=128))
    per_unit = (n128 - n64) / 64
    hidden = round(((target - n64) / per_unit + 64) / mlp_multiple) * mlp_multiple
    if hidden < 8:
        raise ValueError(f"cannot match TEN preset {preset!r} ({target:,} parameters): "
                         "its attention layers alone are larger; set mlp_hidden explicitly")
    return dataclasses.replace(base, mlp_hidden=hidden)


def model_config(arch: str, preset: str, **overrides: Any) -> TENConfig | TransformerConfig:
    if arch == "ten":
        return ten_config(preset, **overrides)
    if arch == "transformer":
        return transformer_config(preset, **overrides)
    raise _unknown("arch", arch, list(ARCHS))


def build_model(config: TENConfig | TransformerConfig,
                device: str | torch.device | None = None) -> LanguageModel:
    """Instantiate the model for a config on ``device`` (None: torch's default device).

    A TEN's scan backend is decided here, once: ``auto`` becomes the backend that runs
    on that device (an explicit one is kept, and checked where it runs). The trainer
    passes its Execution's choice instead (ten.train.execution), decided with the rest
    of how it computes."""
    if isinstance(config, TENConfig):
        model = TENLM(scan_decided(config, device))
    else:
        model = TransformerLM(config)
    return model if device is None else model.to(device)


# A saved model's class, as checkpoints and exported folders name it -> its config.
CONFIG_OF_CLASS: dict[str, type] = {"TENLM": TENConfig, "TransformerLM": TransformerConfig}


def config_of(model_class: str, fields: dict[str, Any]) -> TENConfig | TransformerConfig:
    """The config a saved ``model_class`` (``"TENLM"``, ``"TransformerLM"``) is loaded with,
    from its fields; KeyError for a class this library does not have. Without float8: a
    trained model is evaluated, sampled and exported at its weights' precision on any
    device (fp8 was how it trained, not what it is)."""
    return CONFIG_OF_CLASS[model_class](**{**fields, "fp8": "off", "fp8_head": False})


def count_params(cls: type[LanguageModel], config: Any) -> int:
    with torch.device("meta"):
        return cls(config).num_params()


def preset_table(arch: str = "ten") -> list[dict[str, Any]]:
    """One row per preset: shapes, parameter counts and training FLOPs per token."""
    rows = []
    for name in PRESETS:
        cfg = model_config(arch, name)
        with torch.device("meta"):
            model = build_model(cfg)
        rows.append({
            "name": name,
            "arch": arch,
            "d_model": cfg.d_model,
            "layers": cfg.n_layers,
            "eigenstates": getattr(cfg, "n_eigenstates", None),
            "heads": cfg.n_heads,
            "seq_len": cfg.seq_len,
            "params": model.num_params(),
            "params_non_embedding": model.num_params(exclude_embeddings=True),
            "flops_per_token": model.flops_per_token(cfg.seq_len),
        })
    return rows


def _human(n: float) -> str:
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def format_preset_table(arch: str = "ten") -> str:
    header = ["name", "d_model", "layers", "eigenstates", "heads", "seq_len", "params",
              "non-emb params", "train FLOPs/token"]
    rows = [[r["name"], str(r["d_model"]), str(r["layers"]),
             "-" if r["eigenstates"] is None else str(r["eigenstates"]),
             str(r["heads"]), str(r["seq_len"]), _human(r["params"]),
             _human(r["params_non_embedding"]), _human(r["flops_per_token"])]
            for r in preset_table(arch)]
    return (f"{arch} presets (heads: TEN coupling blocks / transformer attention heads)\n"
            + table(header, rows, right=range(1, len(header)), rule=True))


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHS, default="ten")
    args = parser.parse_args(argv)
    print(format_preset_table(args.arch))


if __name__ == "__main__":
    main()
