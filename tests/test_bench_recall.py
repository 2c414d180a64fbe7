"""benchmarks/bench_recall.py's tasks: each answer is recoverable from the sequence, and
scored only where it is due (so a model can only beat chance by recalling)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_recall as br  # noqa: E402

from ten.loss import IGNORE_INDEX  # noqa: E402


def batch(task, T=64, b=8, seed=0):
    return task.make(b, T, torch.Generator().manual_seed(seed))


def test_copy_first_asks_for_the_first_token_at_the_end():
    x, y = batch(br.copy_first())
    due = y != IGNORE_INDEX
    assert due.sum(1).tolist() == [1] * 8 and due[:, -1].all()
    assert torch.equal(y[:, -1], x[:, 0]) and (x[:, -1] == br.QUERY).all()


def test_selective_copy_asks_for_the_data_tokens_in_order():
    task = br.selective_copy(k=4)
    x, y = batch(task, T=32)
    for row_x, row_y in zip(x, y, strict=True):
        data = row_x[:32 - 5][row_x[:32 - 5] != br.BLANK]
        assert torch.equal(row_y[row_y != IGNORE_INDEX], data)


def test_mqar_answers_are_the_values_paired_with_the_queried_keys():
    task = br.mqar(pairs=4)
    x, y = batch(task, T=40)
    for row_x, row_y in zip(x, y, strict=True):
        pairs = dict(zip(row_x[0:8:2].tolist(), row_x[1:8:2].tolist(), strict=True))
        due = (row_y != IGNORE_INDEX).nonzero().flatten().tolist()
        assert len(due) == 4
        for t in due:
            assert row_y[t].item() == pairs[row_x[t].item()]


def test_induction_answer_follows_the_only_earlier_trigger():
    x, y = batch(br.induction(), T=48)
    for row_x, row_y in zip(x, y, strict=True):
        a = row_x[-1].item()
        (p,) = (row_x[:-1] == a).nonzero().flatten().tolist()
        assert row_y[-1].item() == row_x[p + 1].item()
        assert (row_y[:-1] == IGNORE_INDEX).all()
