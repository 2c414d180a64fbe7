"""How each of the runner's model classes is written in the transformers convention
(used by ``runner.trained.hf_folder``; this file is not copied into an exported folder).

* ``TENLM`` has no standard architecture: its folder carries the model code beside the
  weights (``configuration_ten.py``, ``modeling_ten.py``), loaded with
  ``trust_remote_code=True``, under the runner's own parameter names.
* ``TransformerLM`` (the baseline, with ``mlp: swiglu`` and ``pos: rope``) is a StableLM
  in all but names: pre-LayerNorm with biases, rotary positions over the whole head
  (the rotate-half form), a SiLU-gated MLP, no biases in the linears, the head tied to
  the embedding. It exports as ``StableLmForCausalLM``, which transformers loads with
  no code from the folder; its fused ``qkv`` and gated ``up`` weights are cut into the
  separate projections StableLM names.

A layout maps each runner parameter to the transformers parameters it is cut into
(along the first dimension, in equal pieces, in order), so the same table writes a
folder and reads one back (``ten-runner eval FOLDER``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from runner.trained import MAX_TOKENS

Names = dict[str, list[str]]  # runner parameter -> the transformers parameters it becomes


@dataclass(frozen=True)
class Card:
    """What the exported folder's model card (README.md) says of this kind of model."""

    what: str  # the opening sentence's subject
    tags: str  # the card's tags beside "ten"
    after: str  # after the loading example: what generation carries, what code it needs
    shape: Callable[[Any, str], str]  # one line of the model's shape, from (config, preset)


@dataclass(frozen=True)
class Layout:
    model_class: str  # the runner's class, as checkpoints record it
    architecture: str  # config.json's "architectures"
    code: tuple[str, ...]  # model code of runner/hf_model copied beside the weights
    config: Callable[[Any], dict[str, Any]]  # config.json's model fields from ours
    names: Callable[[Any], Names]  # from the runner's model config
    card: Card

    @property
    def remote_code(self) -> bool:
        """Loading the model needs ``trust_remote_code=True``."""
        return bool(self.code)

    def to_hf(self, cfg: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        for ours, theirs in self.names(cfg).items():
            for name, piece in zip(theirs, state[ours].chunk(len(theirs)), strict=True):
                out[name] = piece.detach().contiguous()
        return out

    def from_hf(self, cfg: Any, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        import torch

        return {ours: torch.cat([weights[name] for name in theirs])
                for ours, theirs in self.names(cfg).items()}


# -- TEN: its own code, its own names -------------------------------------------------
# TENConfig fields the exported model reads (configuration_ten.TENConfig's arguments).
TEN_FIELDS = ("vocab_size", "d_model", "n_layers", "n_eigenstates", "n_heads", "mlp",
              "selective", "conv_width", "norm_eps", "chunk_size", "seq_len", "state")


# A TEN model has no position limit (its state carries any length), but tools size their
# windows by max_position_embeddings, else 2,048 (lm-evaluation-harness): this is the
# length ``ten-runner eval`` scores by default, so both score the same windows.
TEN_MAX_LENGTH = MAX_TOKENS


def _ten_config(cfg: Any) -> dict[str, Any]:
    return {"model_type": "ten",
            "auto_map": {"AutoConfig": "configuration_ten.TENConfig",
                         "AutoModelForCausalLM": "modeling_ten.TENForCausalLM"},
            **{f: getattr(cfg, f) for f in TEN_FIELDS}, "mlp_hidden": cfg.mlp_hidden,
            "value_dim": cfg.head_value_dim,
            "max_position_embeddings": TEN_MAX_LENGTH}


def _ten_names(cfg: Any) -> Names:
    import torch

    from ten.model.presets import build_model

    with torch.device("meta"):
        return {name: [name] for name in build_model(cfg).state_dict()}


def _ten_shape(cfg: Any, preset: str) -> str:
    values = (f", each holding {cfg.head_value_dim} values" if cfg.state == "matrix" else "")
    return (f"TEN {preset}: d_model {cfg.d_model}, {cfg.n_layers} layers, "
            f"{cfg.n_eigenstates} eigenstates{values}{', selective' if cfg.selective else ''}"
            f"{f', conv {cfg.conv_width}' if cfg.conv_width else ''}")


TEN = Layout("TENLM", "TENForCausalLM", ("configuration_ten.py", "modeling_ten.py"),
             _ten_config, _ten_names, Card(
                 what="A Temporal Eigenstate Network language model (a linear-time recurrent "
                      "LM: every layer\nkeeps complex eigenstates instead of attending over "
                      "the past)",
                 tags="recurrent, linear-time",
                 after="Generation carries each layer's state, so a new token costs the same "
                       "however long the\ntext before it.",
                 shape=_ten_shape))


# -- the transformer baseline: a StableLM ----------------------------------------------
def _stablelm_config(cfg: Any) -> dict[str, Any]:
    return {"model_type": "stablelm", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_hidden,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_heads, "hidden_act": "silu",
            "layer_norm_eps": cfg.norm_eps, "max_position_embeddings": cfg.seq_len,
            # transformers 5 reads rope_parameters; 4.x the two keys beside it
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base,
                                "partial_rotary_factor": 1.0},
            "rope_theta": cfg.rope_base, "partial_rotary_factor": 1.0,
            "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False,
            "hidden_dropout": 0.0, "attention_dropout": 0.0, "initializer_range": cfg.init_std}


def _stablelm_names(cfg: Any) -> Names:
    names: Names = {"embed.weight": ["model.embed_tokens.weight"]}
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        for part in ("weight", "bias"):
            names[f"{ours}.norm1.{part}"] = [f"{theirs}.input_layernorm.{part}"]
            names[f"{ours}.norm2.{part}"] = [f"{theirs}.post_attention_layernorm.{part}"]
        names[f"{ours}.mixer.qkv.weight"] = [f"{theirs}.self_attn.{p}_proj.weight"
                                             for p in "qkv"]
        names[f"{ours}.mixer.proj.weight"] = [f"{theirs}.self_attn.o_proj.weight"]
        names[f"{ours}.mlp.up.weight"] = [f"{theirs}.mlp.gate_proj.weight",
                                          f"{theirs}.mlp.up_proj.weight"]  # silu(gate)·up
        names[f"{ours}.mlp.down.weight"] = [f"{theirs}.mlp.down_proj.weight"]
    names["norm.weight"], names["norm.bias"] = ["model.norm.weight"], ["model.norm.bias"]
    return names


def _stablelm_shape(cfg: Any, preset: str) -> str:
    return (f"transformer {preset} (as StableLM): d_model {cfg.d_model}, {cfg.n_layers} "
            f"layers, {cfg.n_heads} heads, rotary positions")


STABLELM = Layout("TransformerLM", "StableLmForCausalLM", (), _stablelm_config,
                  _stablelm_names, Card(
                      what="The transformer baseline (pre-LayerNorm, rotary positions, a "
                           "gated MLP), stored as a\nstandard StableLM (`StableLmForCausalLM`)",
                      tags="transformer, stablelm",
                      after="The model needs no code from this folder; the tokenizer does "
                            "(`tokenization_ten.py`).",
                      shape=_stablelm_shape))

LAYOUTS = {layout.model_class: layout for layout in (TEN, STABLELM)}


def layout_of(model_class: str, cfg: Any) -> Layout:
    """The layout of a model; ValueError (one line, for the user) when it has none."""
    layout = LAYOUTS.get(model_class)
    if layout is None:
        raise ValueError(f"a {model_class} model has no export layout")
    if layout is STABLELM and (cfg.mlp != "swiglu" or cfg.pos != "rope"):
        raise ValueError(f"the transformer baseline exports as a StableLM, which needs "
                         f"mlp: swiglu and pos: rope (this one has mlp: {cfg.mlp}, pos: "
                         f"{cfg.pos})")
    return layout

