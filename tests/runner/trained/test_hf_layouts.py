"""How the runner's models map onto transformers: the transformer baseline is a
StableLM (transformers loads it with no code from the folder and computes the same
logits, with or without its key/value cache); every layout reads back what it wrote."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from runner.trained.hf_folder import hf_config
from runner.trained.hf_model.layouts import STABLELM, TEN, layout_of
from ten.model.presets import build_model
from ten.model.ten import TENConfig
from ten.model.transformer import TransformerConfig

transformers = pytest.importorskip("transformers")
SEED = 20261126
TOKENS = SimpleNamespace(eos_id=1, pad_id=0, bos_id=-1)  # the ids config.json names
SMALL = TransformerConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, seq_len=64,
                          mlp_hidden=48, rope_base=500.0, norm_eps=1e-6)


def trained_looking(cfg):
    """A model whose every parameter (norms and their biases too) is off its default,
    so a weight put in the wrong place shows in the logits."""
    print(f"seed {SEED}")
    torch.manual_seed(SEED)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def written(tmp_path, layout, model):
    from safetensors.torch import save_file

    save_file(layout.to_hf(model.config, model.state_dict()), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_config(layout, model.config, TOKENS)))
    return tmp_path


def test_the_transformer_baseline_loads_as_a_stablelm_with_the_same_logits(tmp_path):
    ours = trained_looking(SMALL)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(written(tmp_path, STABLELM, ours))
    assert type(theirs).__name__ == "StableLmForCausalLM"
    ids = torch.randint(0, SMALL.vocab_size, (2, 37), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        want, _ = ours(ids)
        got = theirs.eval()(ids).logits
        # greedy generation through transformers' key/value cache = ours, recomputed
        prompt = ids[:1, :9]
        cached = theirs.generate(prompt, max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, use_cache=True)
        greedy = prompt
        for _ in range(8):
            greedy = torch.cat([greedy, ours(greedy)[0][:, -1:].argmax(-1)], 1)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert cached.tolist() == greedy.tolist()


@pytest.mark.parametrize("layout, cfg", [
    (STABLELM, SMALL),
    (TEN, TENConfig(vocab_size=97, d_model=32, n_layers=2, n_eigenstates=8, n_heads=2,
                    selective=True, conv_width=4, seq_len=64))], ids=["stablelm", "ten"])
def test_a_layout_reads_back_exactly_what_it_wrote(layout, cfg):
    state = trained_looking(cfg).state_dict()
    back = layout.from_hf(cfg, layout.to_hf(cfg, state))
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("change, named", [({"mlp": "gelu"}, "mlp: gelu"),
                                           ({"pos": "learned"}, "pos: learned")])
def test_a_baseline_stablelm_cannot_hold_is_refused_by_name(change, named):
    cfg = TransformerConfig(**{**SMALL.__dict__, **change})
    with pytest.raises(ValueError, match=f"needs mlp: swiglu and pos: rope.*{named}"):
        layout_of("TransformerLM", cfg)
