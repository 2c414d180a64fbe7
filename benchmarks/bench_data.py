"""Data-pipeline benchmark: every comparison the data issue asks for, measured in one run.

    python benchmarks/bench_data.py [--max-documents N] [--steps N]

1. Pre-tokenize throughput (MB/s, tokens/s) with 1 and 2 processes, against the raw
   sentencepiece encode rate of the same text in the same run (target: >= 0.8 x raw x
   processes). Because a shared machine may not give us two full cores, the run also
   measures how much two busy processes actually get (pure-Python CPU burn, 2 vs 1).
2. Loader throughput (batches/s, batch 8 x seq 256) against the training consumption of
   the tiny TEN model (AdamW step on CPU), plus the measured data wait inside a real
   training loop (target: loader >= 50x faster, wait < 1% of a step).
3. Streaming time to first batch on builtin:botocore-docs (target < 5 s), with the
   corpus and tokenizer cached, and cold (fresh cache: extraction + tokenizer training).
4. Bytes per token on disk: our uint16 shards vs an int64 ``torch.save`` of the same tokens.

Everything runs on the builtin corpus in a temporary cache directory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ten.data import DataConfig, open_data
from ten.data import prepare as prep
from ten.data.pipeline import open_tokenizer, shard_dir, shard_identity
from ten.data.sources import open_source


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def cpu_parallelism(n: int = 20_000_000) -> float:
    """How many cores two CPU-bound processes really get here (2.0 on an idle 2-core box)."""
    t = time.perf_counter()
    _burn(n)
    one = time.perf_counter() - t
    with mp.get_context("fork").Pool(2) as pool:
        pool.map(_burn, [1000, 1000])  # start-up
        t = time.perf_counter()
        pool.map(_burn, [n, n])
        two = time.perf_counter() - t
    return 2 * one / two


def bench_pretokenize(cache: Path, max_documents: int | None, repeats: int,
                      parallelism: float) -> list[tuple[str, str]]:
    base = DataConfig(cache_dir=str(cache), progress=False, max_documents=max_documents,
                      shuffle=False)
    source = open_source(base.dataset, None, base.cache_path)
    t = time.perf_counter()
    source.materialize()
    extract_s = time.perf_counter() - t
    t = time.perf_counter()
    tok = open_tokenizer(base, source)
    train_s = time.perf_counter() - t
    texts = [text for i, (_, text) in enumerate(source.documents())
             if max_documents is None or i < max_documents]
    nbytes = sum(len(x.encode()) for x in texts)
    lines = [line for text in texts for line in text.split("\n")]
    sp = tok._sp  # the raw processor, on purpose
    best = {"raw": float("inf"), 1: float("inf"), 2: float("inf")}
    tokens = 0
    # Interleaved repeats, best of each: on a shared machine the others' load comes and
    # goes, and this compares every variant under the same conditions.
    for _ in range(repeats):
        # Raw rate: sentencepiece's own batch encode of the same text, one thread.
        t = time.perf_counter()
        ntok = sum(len(ids) for ids in sp.encode(lines, num_threads=1))
        best["raw"] = min(best["raw"], time.perf_counter() - t)
        for procs in (1, 2):
            cfg = base.replace(num_proc=procs)
            identity = shard_identity(cfg, source, tok)
            directory = shard_dir(cfg, source, identity)
            prep.remove(directory)
            t = time.perf_counter()
            manifest = prep.prepare(cfg, source, tok, directory, identity)
            best[procs] = min(best[procs], time.perf_counter() - t)
            tokens = sum(s["tokens"] for s in manifest["splits"].values())
    raw_mbs = nbytes / best["raw"] / 1e6
    rows = [("text", f"{nbytes / 1e6:.1f} MB, {len(texts)} documents (extracted in "
             f"{extract_s:.1f} s), vocab {tok.vocab_size} (trained in {train_s:.1f} s)"),
            ("raw sentencepiece encode (1 thread, best of " + str(repeats) + ")",
             f"{raw_mbs:.2f} MB/s  {ntok / best['raw'] / 1e6:.2f} M tok/s")]
    for procs in (1, 2):
        dt = best[procs]
        mbs = nbytes / dt / 1e6
        cores = min(procs, parallelism)
        rows.append((f"pre-tokenize num_proc={procs}",
                     f"{mbs:.2f} MB/s  {tokens / dt / 1e6:.2f} M tok/s  "
                     f"= {mbs / (raw_mbs * procs):.2f} x raw x {procs} (target >= 0.8); "
                     f"{mbs / (raw_mbs * cores):.2f} x raw x {cores:.2f} cores available"))
    return rows


def bench_loader(cache: Path, steps: int) -> list[tuple[str, str]]:
    from ten.model.presets import build_model, model_config

    cfg = DataConfig(cache_dir=str(cache), progress=False, seq_len=256, num_proc=2)
    data = open_data(cfg)
    rows = []
    rates = {}
    for workers in (0, 2):
        it = iter(data.train_loader(batch_size=8, num_workers=workers))
        next(it)  # start-up (workers fork here)
        n = 400
        t = time.perf_counter()
        for _ in range(n):
            next(it)
        rates[workers] = n / (time.perf_counter() - t)
        rows.append((f"loader batches/s (8 x 256, workers={workers})",
                     f"{rates[workers]:,.0f}  ({rates[workers] * 8 * 256 / 1e6:.1f} M tok/s)"))
    torch.manual_seed(0)
    model = build_model(model_config("ten", "tiny", vocab_size=data.tokenizer.vocab_size))
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3)

    def step(batch: torch.Tensor) -> None:
        logits, _ = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    waits, computes = {}, {}
    for workers in (0, 2):
        it = iter(data.train_loader(batch_size=8, num_workers=workers))
        step(next(it))  # warm-up
        wait = compute = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            step(batch)
            t2 = time.perf_counter()
            wait, compute = wait + t1 - t0, compute + t2 - t1
        waits[workers], computes[workers] = wait, compute
    step_s = sum(computes.values()) / (2 * steps)
    rows.append(("tiny TEN train step (AdamW, 8 x 256, CPU)",
                 f"{1 / step_s:.2f} steps/s  ({8 * 256 / step_s:,.0f} tok/s)"))
    rows.append(("loader / model speed", f"{rates[0] * step_s:,.0f} x (workers=0), "
                 f"{rates[2] * step_s:,.0f} x (workers=2)  (target >= 50)"))
    for workers in (0, 2):
        share = waits[workers] / (waits[workers] + computes[workers])
        rows.append((f"data wait in the training loop (workers={workers})",
                     f"{100 * share:.3f} % of step time (target < 1 %)"))
    return rows


def bench_streaming(cache: Path, cold: Path) -> list[tuple[str, str]]:
    rows = []
    for label, where in (("cached corpus + tokenizer", cache), ("cold: extract + train", cold)):
        cfg = DataConfig(mode="streaming", cache_dir=str(where), progress=False, seq_len=256)
        t = time.perf_counter()
        batch = next(iter(open_data(cfg).train_loader(batch_size=8, num_workers=2)))
        dt = time.perf_counter() - t
        assert batch.shape == (8, 257)
        rows.append((f"streaming first batch ({label})", f"{dt:.2f} s (target < 5 s)"))
    return rows


def bench_bytes(cache: Path) -> list[tuple[str, str]]:
    data = open_data(DataConfig(cache_dir=str(cache), progress=False, num_proc=2))
    train = data.manifest["splits"]["train"]
    ours = sum(s["bytes"] for s in train["shards"]) / train["tokens"]
    ids = torch.from_numpy(data.train.read(0, len(data.train)).astype("int64"))
    pt = Path(tempfile.mkdtemp()) / "chunk.pt"
    torch.save(ids, pt)
    theirs = pt.stat().st_size / len(ids)
    shutil.rmtree(pt.parent)
    return [("bytes/token on disk", f"{ours:.3f} (uint16 shard) vs {theirs:.3f} "
             f"(int64 .pt) = {theirs / ours:.1f}x smaller")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-documents", type=int, default=None,
                        help="cap the builtin corpus for the pre-tokenize rows (default: all)")
    parser.add_argument("--steps", type=int, default=10, help="training steps to time")
    parser.add_argument("--repeats", type=int, default=2, help="pre-tokenize repeats (best of)")
    args = parser.parse_args()
    parallelism = cpu_parallelism()
    rows = [("machine", f"{os.cpu_count()} CPUs, torch {torch.__version__}, load average "
             f"{os.getloadavg()[0]:.2f}, 2 busy processes get {parallelism:.2f} cores")]
    with tempfile.TemporaryDirectory() as tmp:
        cache, cold = Path(tmp) / "cache", Path(tmp) / "cold"
        rows += bench_pretokenize(cache, args.max_documents, args.repeats, parallelism)
        rows += bench_loader(cache, args.steps)
        rows += bench_streaming(cache, cold)
        rows += bench_bytes(cache)
    width = max(len(k) for k, _ in rows)
    print("ten.data benchmark (builtin:botocore-docs)")
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
