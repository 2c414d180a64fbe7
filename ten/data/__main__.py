"""``python -m ten.data``: prepare shards ahead of a job, or inspect a prepared directory.

    python -m ten.data prepare --dataset builtin:botocore-docs --seq-len 256 --vocab-size 4096
    python -m ten.data inspect ~/.cache/ten/shards/builtin_botocore-docs-<fingerprint>

Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ten.data.config import DataConfig, TokenizerConfig
from ten.data.errors import DataError, disk_errors


def _prepare(args: argparse.Namespace) -> None:
    from ten.data import pipeline, prepare, sources

    cfg = DataConfig(
        dataset=args.dataset, mode=args.mode, seq_len=args.seq_len, text_field=args.text_field,
        data_files=args.data_files,
        tokenizer=TokenizerConfig(vocab_size=args.vocab_size, type=args.tokenizer_type,
                                  path=args.tokenizer_path),
        num_proc=args.num_proc, val_fraction=args.val_fraction, cache_dir=args.cache_dir,
        max_documents=args.max_documents, shard_tokens=args.shard_tokens,
        progress=not args.quiet)
    if cfg.mode == "streaming":
        raise DataError("streaming mode prepares nothing; use --mode pretokenized or download")
    if args.force:
        source = sources.open_source(cfg.dataset, cfg.text_field, cfg.cache_path, cfg.data_files)
        with disk_errors(cfg.cache_path):  # as open_data does: a full disk is one line
            tok = pipeline.open_tokenizer(cfg, source)
            prepare.remove(pipeline.shard_dir(cfg, source,
                                              pipeline.shard_identity(cfg, source, tok)))
    data = pipeline.open_data(cfg)
    print(data.prepared_dir)
    print(_summary(data.manifest), file=sys.stderr)


def _summary(manifest: dict) -> str:
    lines = [f"fingerprint {manifest['fingerprint']}  seq_len {manifest['seq_len']}  "
             f"dtype {manifest['dtype']}  tokenizer {manifest['tokenizer']['fingerprint']} "
             f"(vocab {manifest['tokenizer']['vocab_size']})  source {manifest['source']['name']}"]
    for name, split in manifest["splits"].items():
        size = sum(s["bytes"] for s in split["shards"])
        lines.append(f"{name:5s} {split['documents']:>10,} docs {split['tokens']:>14,} tokens "
                     f"{split['sequences']:>10,} seqs {len(split['shards']):>4} shards "
                     f"{size / 1e6:>10.1f} MB")
    lines.append("documents: " + json.dumps(manifest["documents"], sort_keys=True))
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> None:
    from ten.data.shards import verify

    directory = Path(args.directory).expanduser()
    try:
        command = json.loads((directory / "manifest.json").read_text()).get("command", "")
    except (OSError, ValueError):
        command = "python -m ten.data prepare ... --force"
    manifest = verify(directory, {}, command, checksums=not args.no_checksums)
    print(_summary(manifest))
    path = Path(manifest["tokenizer"]["path"])
    if args.sample and path.exists() and manifest["splits"]["train"]["tokens"]:
        from ten.data.shards import TokenStream
        from ten.data.tokenizer import Tokenizer

        stream = TokenStream(directory, manifest["splits"]["train"]["shards"], manifest["dtype"])
        ids = stream.read(0, min(args.sample, len(stream)))
        print("sample: " + repr(Tokenizer(path).decode(ids.tolist())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ten.data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = DataConfig()
    p = sub.add_parser("prepare", help="tokenize a dataset into shards (idempotent, resumable)")
    p.add_argument("--dataset", default=d.dataset)
    p.add_argument("--mode", default="pretokenized", choices=("pretokenized", "download"))
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--text-field")
    p.add_argument("--data-files")
    p.add_argument("--vocab-size", type=int, default=d.tokenizer.vocab_size)
    p.add_argument("--tokenizer-type", default=d.tokenizer.type)
    p.add_argument("--tokenizer-path")
    p.add_argument("--num-proc", type=int)
    p.add_argument("--val-fraction", type=float, default=d.val_fraction)
    p.add_argument("--cache-dir")
    p.add_argument("--max-documents", type=int)
    p.add_argument("--shard-tokens", type=int, default=d.shard_tokens)
    p.add_argument("--force", action="store_true", help="delete and rebuild the shards")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    i = sub.add_parser("inspect", help="verify a prepared directory and print its manifest")
    i.add_argument("directory")
    i.add_argument("--no-checksums", action="store_true", help="skip the sha256 check")
    i.add_argument("--sample", type=int, default=64, help="decode this many tokens (0: none)")
    args = parser.parse_args(argv)
    try:
        (_prepare if args.command == "prepare" else _inspect)(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
