"""python -m ten.data prepare / inspect."""

from __future__ import annotations

import subprocess
import sys

from ten.data.__main__ import main


def _args(cfg):
    return ["--dataset", cfg.dataset, "--seq-len", str(cfg.seq_len), "--vocab-size",
            str(cfg.tokenizer.vocab_size), "--val-fraction", str(cfg.val_fraction),
            "--num-proc", "1",
            "--cache-dir", cfg.cache_dir, "--quiet"]


def test_prepare_then_inspect(cfg, capsys):
    assert main(["prepare", *_args(cfg)]) == 0
    out = capsys.readouterr()
    directory = out.out.strip()
    assert directory.endswith(".jsonl-" + directory.rsplit("-", 1)[1])
    assert "train" in out.err and "tokens" in out.err
    assert main(["inspect", directory]) == 0
    shown = capsys.readouterr().out
    assert "seq_len 32" in shown and "sample: " in shown


def test_a_damaged_shard_is_prepared_again_and_force_rebuilds(cfg, capsys):
    assert main(["prepare", *_args(cfg)]) == 0
    directory = capsys.readouterr().out.strip()
    shard = f"{directory}/train-000000.bin"
    with open(shard, "r+b") as f:  # corrupt it
        f.seek(100)
        f.write(b"\xff\xff")
    assert main(["prepare", *_args(cfg)]) == 0  # the cache's own copy: made again
    err = capsys.readouterr().err
    assert "is damaged" in err and "preparing it again" in err
    assert main(["prepare", *_args(cfg), "--force"]) == 0
    assert main(["inspect", directory]) == 0


def test_errors_are_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ten.data", "prepare", "--dataset", "nope",
                          "--cache-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "unknown dataset 'nope'" in out.stderr
    assert main(["inspect", str(tmp_path)]) == 2
