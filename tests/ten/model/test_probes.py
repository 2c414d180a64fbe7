"""The recall probe (ten.model.probes.repeat_recall): scored on the repeat only, aligned so a
model that recalls scores 1 and one that does not scores chance."""

import torch
from torch import nn

from ten.model import probes
from ten.model.presets import build_model, model_config

V = 64


class Oracle(nn.Module):
    """A 'model' whose head picks, at each position, the token ``lag`` places before the
    next one (lag = the repeat's period: perfect recall; lag 1: it echoes its input)."""

    def __init__(self, lag: int):
        super().__init__()
        self.lag, self.config = lag, type("C", (), {"vocab_size": V})()
        self.output_weight = torch.eye(V)

    def hidden_states(self, ids, state=None):
        # position t predicts token t + 1: recall it from t + 1 - lag
        source = torch.roll(ids, shifts=self.lag - 1, dims=1)
        return nn.functional.one_hot(source, V).float(), None


def test_a_model_that_recalls_scores_one_and_an_echo_scores_chance():
    half = 32
    assert probes.repeat_recall(Oracle(lag=half), 2 * half, torch.device("cpu")) == 1.0
    echo = probes.repeat_recall(Oracle(lag=1), 2 * half, torch.device("cpu"))
    assert echo < 0.1  # chance is 1/60 here


def test_the_probe_is_seeded_short_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = build_model(model_config("ten", "tiny", vocab_size=V, d_model=32, n_layers=1,
                                     seq_len=8192))
    model.train()
    shapes, real = [], model.hidden_states
    model.hidden_states = lambda ids, state=None: (shapes.append(tuple(ids.shape)),
                                                   real(ids, state))[1]
    a = probes.repeat_recall(model, 8192, torch.device("cpu"))
    b = probes.repeat_recall(model, 8192, torch.device("cpu"))
    assert a == b and 0.0 <= a <= 1.0 and model.training
    assert shapes == [(probes.ROWS, probes.MAX_TOKENS - 1)] * 2  # not 8192


def test_the_probe_compiles_nothing_in_a_compiled_model():
    """train.compile compiles every block; the probe's rows and length are not a batch's,
    so running the compiled blocks would compile them again for its shapes (with dynamic
    shapes: on a GPU, minutes of a run; here it had doubled the compile test's time). It
    runs eagerly."""
    torch.manual_seed(0)
    model = build_model(model_config("ten", "tiny", vocab_size=V, d_model=32, n_layers=2,
                                     seq_len=16))
    for block in model.blocks:
        block.compile(backend="eager")  # dynamo traces and guards; no inductor
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    with torch.no_grad():
        model.hidden_states(torch.randint(0, V, (3, 16)))
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1
    score = probes.repeat_recall(model, 16, torch.device("cpu"))  # 4 rows of 15 tokens
    assert 0.0 <= score <= 1.0
    assert counters["stats"]["unique_graphs"] == compiled
