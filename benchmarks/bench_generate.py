"""Generation from an exported model (``ten-runner export-model``, loaded by transformers):
the carried state against recomputing the prefix for every new token.

A tiny TEN model (untrained: the cost does not depend on the weights) is exported the
way a run's checkpoint is, loaded with ``AutoModelForCausalLM`` and timed per new token
after prompts of several lengths, two ways: ``generate()`` (which carries each layer's
state) and a loop that runs the whole sequence again for every token (what a model with
no cache does). Printed: the median milliseconds per new token, and each way's cost at
the longest prompt over its cost at the shortest — O(1) per token stays near 1.

    python benchmarks/bench_generate.py [--lengths 128,1024,4096] [--new 16] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def exported_folder(tmp: Path) -> Path:
    """A tiny TEN checkpoint and tokenizer laid out as a run, exported."""
    from runner.trained.hf_folder import export_model
    from ten.data.tokenizer import train
    from ten.model.presets import build_model, model_config
    from ten.train import checkpoint as ckpt

    run = tmp / "run"
    words = "the state carries every token before it so a new one costs the same".split()
    train((" ".join(words[i:] + words[:i]) for i in range(300)), run / "tokenizer.model",
          vocab_size=300)
    config = model_config("ten", "tiny", vocab_size=300, seq_len=256)
    torch.manual_seed(0)
    model = build_model(config)
    meta = {"identity": {}, "resolved": {"model": {"preset": "tiny"}},
            "model_config": dataclasses.asdict(config), "model_class": "TENLM"}
    ckpt.save(run / "checkpoints", 1, {"model.pt": model.state_dict(),
                                       "config.json": json.dumps(meta).encode()})
    return export_model(run, tmp / "exported")


def measure(model, prompt_len: int, new: int) -> dict[str, float]:
    """Milliseconds per new token, from the time between consecutive forward calls after
    the prompt's (each call is one new token, either way)."""
    ids = torch.randint(0, 300, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    stamps: list[float] = []
    hook = model.register_forward_pre_hook(lambda *_: stamps.append(time.perf_counter()))

    def per_token(run) -> float:
        stamps.clear()
        run()
        gaps = [b - a for a, b in zip(stamps[1:-1], stamps[2:], strict=True)]  # after the prompt
        return 1e3 * sorted(gaps)[len(gaps) // 2]

    def carried() -> None:
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    def recomputed() -> None:
        seq = ids
        with torch.no_grad():
            for _ in range(new):
                nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
                seq = torch.cat([seq, nxt], dim=1)

    try:
        carried()  # warm-up
        return {"prompt": prompt_len, "carried_ms": per_token(carried),
                "recomputed_ms": per_token(recomputed)}
    finally:
        hook.remove()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="128,1024,4096")
    p.add_argument("--new", type=int, default=16, help="tokens generated per timing")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import transformers

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as tmp:
        folder = exported_folder(Path(tmp))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=True).eval()
        rows = [measure(model, int(n), args.new) for n in args.lengths.split(",")]
    first, last = rows[0], rows[-1]
    growth = {"carried": last["carried_ms"] / first["carried_ms"],
              "recomputed": last["recomputed_ms"] / first["recomputed_ms"]}
    if args.json:
        print(json.dumps({"rows": rows, "growth": growth}, indent=1))
        return 0
    print(f"{'prompt':>7} {'carried ms/token':>17} {'recomputed ms/token':>20}")
    for r in rows:
        print(f"{r['prompt']:>7} {r['carried_ms']:>17.2f} {r['recomputed_ms']:>20.2f}")
    print(f"cost per token at {last['prompt']} over {first['prompt']} tokens of prompt: "
          f"carried {growth['carried']:.2f}x, recomputed {growth['recomputed']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
