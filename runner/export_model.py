"""``ten-runner export-model``: a trained run as a folder other tools load.

The folder follows the Hugging Face ``transformers`` convention::

    model.safetensors        the weights alone (safetensors: loading runs no code)
    config.json              the model's shape, and which classes load it (auto_map)
    configuration_ten.py     TENConfig            } plain torch + transformers
    modeling_ten.py          TENForCausalLM       } (runner/hf_model/), loaded with
    tokenization_ten.py      TENTokenizer         } trust_remote_code=True
    tokenizer.model          the sentencepiece model the run trained with
    tokenizer_config.json, special_tokens_map.json, generation_config.json
    README.md                a model card: preset, parameters, data, tokens seen,
                             held-out loss and perplexity, the job that made it

It is written in a temporary folder beside ``out`` and renamed into place: an existing
folder is never overwritten, and a failed export leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

HF_FILES = ("configuration_ten.py", "modeling_ten.py", "tokenization_ten.py")
HF_SOURCE = Path(__file__).resolve().parent / "hf_model"
# TENConfig fields the exported model reads (configuration_ten.TENConfig's arguments).
CONFIG_FIELDS = ("vocab_size", "d_model", "n_layers", "n_eigenstates", "n_heads", "mlp",
                 "selective", "conv_width", "norm_eps", "chunk_size", "seq_len")


def export_model(where: str | Path, out: str | Path, *, job: str | None = None,
                 step: int | None = None, endpoint_url: str | None = None) -> Path:
    """Write the folder for a run (see the module doc); returns its path. UserError (one
    line) for a run that cannot be exported or an ``out`` that already exists."""
    from runner.errors import UserError
    from runner.sample import trained_model
    from ten.trainstate import read_config

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists and is not empty; choose a new --out folder")
    run_dir, name, found, model = trained_model(where, job, endpoint_url, step)
    saved = read_config(found.path)
    if saved["model_class"] != "TENLM":
        raise UserError(f"{name} is a {saved['model_class']}: only TEN models export for "
                        "now (the transformer baseline does not)")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_folder(tmp, model, run_dir, name, found, saved)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_folder(folder: Path, model: Any, run_dir: Path, name: str, found: Any,
                  saved: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    from ten.data import Tokenizer

    tokenizer = Tokenizer(run_dir / "tokenizer.model")
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for file in HF_FILES:
        shutil.copyfile(HF_SOURCE / file, folder / file)
    shutil.copyfile(run_dir / "tokenizer.model", folder / "tokenizer.model")
    specials = _special_tokens(tokenizer)
    _json(folder / "config.json", hf_config(model.config, tokenizer))
    _json(folder / "tokenizer_config.json", {
        "tokenizer_class": "TENTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_ten.TENTokenizer", None]},
        "clean_up_tokenization_spaces": False,
        "model_max_length": model.config.seq_len, **specials})
    _json(folder / "special_tokens_map.json", specials)
    # use_cache off: the model carries its own state (modeling_ten.py)
    _json(folder / "generation_config.json", {**_token_ids(tokenizer), "use_cache": False})
    (folder / "README.md").write_text(model_card(model, name, found, saved, run_dir))


def load_exported(folder: Path) -> tuple[Any, Any]:
    """(model, Tokenizer) of an exported folder, as the runner's own classes (no
    transformers needed); UserError (one line) when it is not one."""
    from safetensors.torch import load_file

    from runner.errors import UserError
    from ten.data import Tokenizer
    from ten.model import TENConfig
    from ten.presets import build_model

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
        model = build_model(TENConfig(**config["ten_config"]))
        model.load_state_dict(load_file(folder / "model.safetensors"))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise UserError(f"{folder} is not a folder ten-runner export-model wrote "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                        ) from None
    return model.eval(), Tokenizer(folder / "tokenizer.model")


def hf_config(cfg: Any, tokenizer: Any) -> dict[str, Any]:
    """config.json: the model's shape under configuration_ten.TENConfig's names."""
    return {
        "architectures": ["TENForCausalLM"], "model_type": "ten",
        "auto_map": {"AutoConfig": "configuration_ten.TENConfig",
                     "AutoModelForCausalLM": "modeling_ten.TENForCausalLM"},
        **{f: getattr(cfg, f) for f in CONFIG_FIELDS}, "mlp_hidden": cfg.mlp_hidden,
        "tie_word_embeddings": True, "torch_dtype": "float32",
        "ten_config": dataclasses.asdict(cfg),  # what load_exported rebuilds exactly
        **_token_ids(tokenizer),
    }


def _token_ids(tokenizer: Any) -> dict[str, int]:
    """eos/pad (and bos, when the tokenizer has one) ids, as config files name them."""
    ids = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if tokenizer.bos_id >= 0:
        ids["bos_token_id"] = tokenizer.bos_id
    return ids


def _special_tokens(tokenizer: Any) -> dict[str, str]:
    sp = tokenizer._sp
    tokens = {"eos_token": sp.id_to_piece(tokenizer.eos_id),
              "pad_token": sp.id_to_piece(tokenizer.pad_id)}
    if tokenizer.bos_id >= 0:
        tokens["bos_token"] = sp.id_to_piece(tokenizer.bos_id)
    if tokenizer.unk_id >= 0:
        tokens["unk_token"] = sp.id_to_piece(tokenizer.unk_id)
    return tokens


def model_card(model: Any, name: str, found: Any, saved: dict[str, Any],
               run_dir: Path) -> str:
    """README.md: what the model is, what it saw, how it scored, and how to load it."""
    job = saved["resolved"]
    cfg = model.config
    loss = _last_eval_loss(run_dir / "metrics.jsonl", found.step)
    tokens = _tokens_seen(found.path)
    data = job.get("data") or {}
    rows = [("model", f"TEN {job.get('model', {}).get('preset', '?')}: d_model {cfg.d_model}, "
                      f"{cfg.n_layers} layers, {cfg.n_eigenstates} eigenstates"
                      f"{', selective' if cfg.selective else ''}"
                      f"{f', conv {cfg.conv_width}' if cfg.conv_width else ''}"),
            ("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
            ("data", f"{data.get('dataset', '?')} (seq_len {data.get('seq_len', '?')})"),
            ("vocabulary", f"{cfg.vocab_size} (sentencepiece, tokenizer.model)"),
            ("step", str(found.step)),
            ("tokens seen", f"{tokens:,}" if isinstance(tokens, int) else "?"),
            ("held-out loss", f"{loss:.4f}" if isinstance(loss, float) else "?"),
            ("held-out perplexity",
             f"{math.exp(min(loss, 50.0)):.2f}" if isinstance(loss, float) else "?")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"""---
library_name: transformers
tags: [ten, recurrent, linear-time]
---

# {name}

A Temporal Eigenstate Network language model (a linear-time recurrent LM: every layer
keeps complex eigenstates instead of attending over the past), trained by ten-runner
(job `{name}`) and exported at step {found.step}.

| | |
|---|---|
{table}

The held-out numbers are those of the last evaluation at or before this step, on the
run's own held-out split; perplexity depends on the tokenizer, so compare models with
different vocabularies by bits per byte instead.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)
ids = tokenizer("The", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0]))
```

Generation carries each layer's state, so a new token costs the same however long the
text before it. The job that made it (secrets redacted):

```json
{json.dumps(job, indent=1, default=str)}
```
"""


def _last_eval_loss(metrics: Path, step: int) -> float | None:
    """The held-out loss of the run's last evaluation at or before ``step``."""
    from ten.metrics import MetricKind, read_metrics

    loss = None
    for record in read_metrics(metrics):
        if record.get("kind") == MetricKind.EVAL and isinstance(record.get("step"), int) \
                and record["step"] <= step and isinstance(record.get("loss"), float):
            loss = record["loss"]
    return loss


def _tokens_seen(path: Path) -> int | None:
    from ten import checkpoint as ckpt

    try:
        tokens = ckpt.load(path, "trainer.pt").get("tokens")
    except (ckpt.CheckpointError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) else None


def _json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
