"""``ten-runner export-model``: a trained run as a folder other tools load.

The folder follows the Hugging Face ``transformers`` convention::

    model.safetensors        the weights alone (safetensors: loading runs no code)
    config.json              the model's shape, and which classes load it
    configuration_ten.py     TENConfig            } a TEN model only: plain torch +
    modeling_ten.py          TENForCausalLM       } transformers (runner/trained/hf_model/),
                                                  } trust_remote_code=True
    tokenization_ten.py      TENTokenizer (the run's sentencepiece model, its ids)
    tokenizer.model          the sentencepiece model the run trained with
    tokenizer_config.json, special_tokens_map.json, generation_config.json
    README.md                a model card: model, parameters, data, tokens seen,
                             held-out loss and perplexity, the job that made it

The transformer baseline is a standard StableLM (``StableLmForCausalLM``: no model code
in the folder); how each model class maps onto transformers is
:mod:`runner.trained.hf_model.layouts`. ``config.json`` also keeps the runner's own config
(``ten_config``, ``ten_model_class``) so ``ten-runner eval FOLDER`` rebuilds it exactly.

It is written in a temporary folder beside ``out`` and renamed into place: an existing
folder is never overwritten (``overwrite`` replaces an earlier export, in one rename), and
a failed or stopped export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.storage.mirror import METRICS

HF_SOURCE = Path(__file__).resolve().parent / "hf_model"
TOKENIZER_CODE = "tokenization_ten.py"


def export_model(where: str | Path, out: str | Path, *, job: str | None = None,
                 step: int | None = None, endpoint_url: str | None = None,
                 overwrite: bool = False, stop: Any = None) -> Path:
    """Write the folder for a run (see the module doc); returns its path. UserError (one
    line) for a run that cannot be exported, an ``out`` that already exists (unless
    ``overwrite`` and it holds an earlier export), or a full or read-only disk (exit 4).
    ``stop`` (a ten.train.stop.Stop): a stop signal while writing raises its Interrupted with
    nothing left behind; one during the final rename is noted and the export finishes."""
    from runner.errors import UserError
    from runner.trained.hf_model.layouts import layout_of
    from runner.trained.sample import run_tokenizer, trained_model
    from ten.train.trainstate import read_config

    out = Path(out)
    _check_out(out, overwrite)
    run_dir, name, found, model = trained_model(where, job, endpoint_url, step)
    run_tokenizer(run_dir, found)  # damaged or another: refused before anything is written
    saved = read_config(found.path)
    try:
        layout = layout_of(saved["model_class"], model.config)
    except ValueError as e:
        raise UserError(f"{name} cannot be exported: {e}") from None
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_folder(tmp, layout, model, run_dir, name, found, saved)
        with stop.deferred("the export's rename") if stop else contextlib.nullcontext():
            if out.exists():  # empty, or an earlier export (checked above)
                os.replace(out, old)
            os.replace(tmp, out)
    except OSError as e:
        _disk_error(e, out)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return out


def _check_out(out: Path, overwrite: bool) -> None:
    from runner.errors import UserError

    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise UserError(f"{out} already exists and is not empty; choose a new --out folder, "
                        "or pass --overwrite to replace an earlier export there")
    if not is_export(out):
        raise UserError(f"{out} is not a folder export-model wrote (no config.json naming "
                        "ten_config); --overwrite replaces only an earlier export")


def is_export(folder: Path) -> bool:
    """``folder`` holds what export-model wrote (its config.json names ten_config)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "ten_config" in config


def _disk_error(e: OSError, out: Path) -> None:
    """A full, read-only or forbidden disk: one line naming ``out`` and its free space,
    exit 4 (nothing was exported); any other OSError is left to its caller."""
    from runner.errors import UserError
    from runner.exit_codes import ExitCode
    from ten.fileio import ENVIRONMENT_ERRNOS, describe_os_error

    if e.errno in ENVIRONMENT_ERRNOS:
        raise UserError(f"{describe_os_error(e, out)}; nothing was exported: free space "
                        "there or choose another --out", exit_code=ExitCode.STORAGE) from None


def hub_token(repo: str, environ: Mapping[str, str] | None = None) -> str:
    """Check a ``--push-to-hub`` before anything is exported: the repository id's form
    and ``HF_TOKEN`` in the environment; returns the token (never shown)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from runner.errors import UserError
    from runner.exit_codes import ExitCode

    environ = os.environ if environ is None else environ
    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise UserError(f"--push-to-hub {repo!r} is not a Hub repository id: OWNER/NAME of "
                        "letters, digits, '-', '_' and '.'", exit_code=ExitCode.CONFIG) from None
    token = environ.get("HF_TOKEN", "")
    if not token.strip():
        raise UserError("--push-to-hub needs HF_TOKEN in the environment (a token with "
                        "write access: https://huggingface.co/settings/tokens)",
                        exit_code=ExitCode.CLOUD_CREDENTIALS)
    return token


def push_to_hub(folder: Path, repo: str, token: str, *, private: bool = False,
                environ: Mapping[str, str] | None = None) -> str:
    """Create ``repo`` (a model repository, kept if it exists) and upload ``folder`` to
    it in one commit; returns its URL. ``HF_ENDPOINT`` picks another Hub. A failure is
    one line without the token, and the folder stays where it is to push again."""
    from huggingface_hub import HfApi

    from runner.errors import UserError
    from runner.exit_codes import ExitCode

    environ = os.environ if environ is None else environ
    api = HfApi(endpoint=environ.get("HF_ENDPOINT") or None, token=token)
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, repo_type="model", folder_path=folder,
                          commit_message=f"ten-runner export-model ({folder.name})")
    except Exception as e:  # the Hub client's errors (HTTP, connection, offline mode)
        why = " ".join(str(e).split())[:300].replace(token, "***")
        raise UserError(f"cannot push to the Hub repository {repo} ({type(e).__name__}: "
                        f"{why}); the folder is kept at {folder}: push it later with "
                        f"`hf upload {repo} {folder}`",
                        exit_code=ExitCode.STORAGE) from None
    return str(url)


def _write_folder(folder: Path, layout: Any, model: Any, run_dir: Path, name: str,
                  found: Any, saved: dict[str, Any]) -> None:
    from safetensors.torch import save

    from ten.data import Tokenizer

    tokenizer = Tokenizer(run_dir / "tokenizer.model")
    weights = layout.to_hf(model.config, model.state_dict())
    # serialized here and written by Python, so a full disk is an OSError (ENOSPC), not
    # safetensors' own error type
    (folder / "model.safetensors").write_bytes(save(weights, metadata={"format": "pt"}))
    for file in (*layout.code, TOKENIZER_CODE):
        shutil.copyfile(HF_SOURCE / file, folder / file)
    shutil.copyfile(run_dir / "tokenizer.model", folder / "tokenizer.model")
    specials = _special_tokens(tokenizer)
    config = hf_config(layout, model.config, tokenizer)
    _json(folder / "config.json", config)
    _json(folder / "tokenizer_config.json", {
        "tokenizer_class": "TENTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_ten.TENTokenizer", None]},
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"], **specials})
    _json(folder / "special_tokens_map.json", specials)
    # A TEN model carries its own state (modeling_ten.py), not transformers' cache.
    _json(folder / "generation_config.json",
          {**_token_ids(tokenizer), "use_cache": not layout.remote_code})
    (folder / "README.md").write_text(model_card(layout, model, name, found, saved, run_dir))


def load_exported(folder: Path) -> tuple[Any, Any]:
    """(model, Tokenizer) of an exported folder, as the runner's own classes (no
    transformers needed); UserError (one line) when it is not one."""
    from safetensors.torch import load_file

    from runner.errors import UserError
    from runner.trained.hf_model.layouts import LAYOUTS
    from ten.data import Tokenizer
    from ten.model.presets import build_model, config_of

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
        layout = LAYOUTS[config.get("ten_model_class", "TENLM")]  # older folders: TEN
        cfg = config_of(layout.model_class, config["ten_config"])
        model = build_model(cfg)
        model.load_state_dict(layout.from_hf(cfg, load_file(folder / "model.safetensors")))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise UserError(f"{folder} is not a folder ten-runner export-model wrote "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                        ) from None
    return model.eval(), Tokenizer(folder / "tokenizer.model")


def hf_config(layout: Any, cfg: Any, tokenizer: Any) -> dict[str, Any]:
    """config.json: the model's shape under the names its transformers class reads, and
    the runner's own config to rebuild it exactly."""
    return {"architectures": [layout.architecture], **layout.config(cfg),
            "tie_word_embeddings": True, "torch_dtype": "float32",
            "ten_model_class": layout.model_class, "ten_config": dataclasses.asdict(cfg),
            **_token_ids(tokenizer)}


def _special_ids(tokenizer: Any) -> dict[str, int]:
    """Each special token's id. The BOS is the EOS: every document follows one in
    training, sentencepiece's own BOS is never seen (the exported tokenizer's docstring,
    tokenization_ten.py, says so to its users)."""
    ids = {"eos": tokenizer.eos_id, "pad": tokenizer.pad_id, "bos": tokenizer.eos_id}
    return ids | ({"unk": tokenizer.unk_id} if getattr(tokenizer, "unk_id", -1) >= 0 else {})


def _token_ids(tokenizer: Any) -> dict[str, int]:
    """eos/pad/bos ids, as config files name them."""
    return {f"{kind}_token_id": i for kind, i in _special_ids(tokenizer).items()
            if kind != "unk"}


def _special_tokens(tokenizer: Any) -> dict[str, str]:
    """The special tokens' pieces, as tokenizer files name them."""
    return {f"{kind}_token": tokenizer._sp.id_to_piece(i)
            for kind, i in _special_ids(tokenizer).items()}


def model_card(layout: Any, model: Any, name: str, found: Any, saved: dict[str, Any],
               run_dir: Path) -> str:
    """README.md: what the model is, what it saw, how it scored, and how to load it."""
    from runner.trained.sample import ppl

    job = saved["resolved"]
    cfg = model.config
    loss = _last_eval_loss(run_dir / METRICS, found.step)
    tokens = _tokens_seen(found.path)
    data = job.get("data") or {}
    card = layout.card
    rows = [("model", card.shape(cfg, job.get("model", {}).get("preset", "?"))),
            ("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
            ("data", f"{data.get('dataset', '?')} (seq_len {data.get('seq_len', '?')})"),
            ("vocabulary", f"{cfg.vocab_size} (sentencepiece, tokenizer.model)"),
            ("step", str(found.step)),
            ("tokens seen", f"{tokens:,}" if isinstance(tokens, int) else "?"),
            ("held-out loss", f"{loss:.4f}" if isinstance(loss, float) else "?"),
            ("held-out perplexity",
             f"{ppl(loss):.2f}" if isinstance(loss, float) else "?")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    trust = ", trust_remote_code=True" if layout.remote_code else ""
    return f"""---
library_name: transformers
tags: [ten, {card.tags}]
---

# {name}

{card.what}, trained by ten-runner (job `{name}`) and exported at step {found.step}.

| | |
|---|---|
{table}

The held-out numbers are those of the last evaluation at or before this step, on the
run's own held-out split; perplexity depends on the tokenizer, so compare models with
different vocabularies by bits per byte instead.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH"{trust})
tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)
ids = tokenizer("The", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0]))
```

{card.after} The job that made it (secrets redacted):

```json
{json.dumps(job, indent=1, default=str)}
```
"""


def _last_eval_loss(metrics: Path, step: int) -> float | None:
    """The held-out loss of the run's last evaluation at or before ``step``."""
    from ten.train.metrics import MetricKind, read_metrics

    loss = None
    for record in read_metrics(metrics):
        if record.get("kind") == MetricKind.EVAL and isinstance(record.get("step"), int) \
                and record["step"] <= step and isinstance(record.get("loss"), float):
            loss = record["loss"]
    return loss


def _tokens_seen(path: Path) -> int | None:
    from ten.train import checkpoint as ckpt

    try:
        tokens = ckpt.load(path, "trainer.pt").get("tokens")
    except (ckpt.CheckpointError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) else None


def _json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
