"""Sequence-length warm-up (ten.train.seqwarmup): shorter rows that predict the same tokens,
and a schedule that is a function of the step. The trainer's use of it (a resume in the
middle of it is bit-exact): tests/ten/train/test_trainer.py."""

import pytest
import torch

from ten.train.seqwarmup import length_at, lengths, split_rows

SEED = 1126


@pytest.mark.parametrize("length", [8, 16, 32, 64])
def test_split_rows_predict_the_same_tokens_from_the_same_data(length):
    torch.manual_seed(SEED)
    batch = torch.randint(0, 1000, (3, 65))
    rows = split_rows(batch, length)
    assert rows.shape == (3 * 64 // length, length + 1)
    per = rows.reshape(3, 64 // length, length + 1)
    assert torch.equal(per[:, :, 1:].reshape(3, 64), batch[:, 1:])  # every target once
    assert torch.equal(per[:, :, :-1].reshape(3, 64), batch[:, :-1])  # after its input


def test_the_schedule_doubles_in_equal_shares_then_holds():
    assert lengths(256, 64) == [64, 128, 256]
    got = [length_at(step, 256, 64, 10) for step in range(1, 13)]
    assert got == [64] * 5 + [128] * 5 + [256, 256]
    assert [length_at(s, 256, None, 0) for s in (1, 100)] == [256, 256]
    for start in (0, 48, 256, 512, 96):
        with pytest.raises(ValueError, match="over a power of two"):
            lengths(256, start)
