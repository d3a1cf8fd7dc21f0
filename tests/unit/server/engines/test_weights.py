"""`load_state`, the one in-place weight copy of the in-process engines: its tied-weight rule, its
checks (all or nothing) and its casts, on a hand-built module with a tied head."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from liveloop.transport.weights import WeightsRejected, load_state


class Tied(nn.Module):
    """An embedding and an LM head that share one weight, plus an untied layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 2)
        self.mid = nn.Linear(2, 2, bias=False)
        self.head = nn.Linear(2, 4, bias=False)
        self.head.weight = self.embed.weight


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.full((4, 2), value), "mid.weight": torch.full((2, 2), value)}


def test_a_tied_name_counts_as_given_by_its_partner():
    m = Tied()
    load_state(m, _state(0.5))  # no "head.weight": it is the embedding's tensor
    assert torch.equal(m.head.weight, torch.full((4, 2), 0.5)) and torch.equal(m.mid.weight, torch.full((2, 2), 0.5))
    load_state(m, {"head.weight": torch.full((4, 2), 2.0), "mid.weight": torch.ones(2, 2)})  # either name will do
    assert torch.equal(m.embed.weight, torch.full((4, 2), 2.0))


def test_tied_names_given_twice_the_last_one_serves():
    m = Tied()
    load_state(m, {**_state(1.0), "head.weight": torch.full((4, 2), 3.0)})
    assert torch.equal(m.embed.weight, torch.full((4, 2), 3.0))


def test_an_untied_name_missing_is_refused_and_nothing_changes():
    m = Tied()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(WeightsRejected, match=r"missing tensors \['mid.weight'\]"):
        load_state(m, {"embed.weight": torch.zeros(4, 2)})
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_non_finite_values_are_refused_before_anything_is_copied():
    m = Tied()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bad = _state(1.0)
    bad["mid.weight"][0, 0] = float("inf")
    with pytest.raises(WeightsRejected, match="non-finite values in mid.weight"):
        load_state(m, bad)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # embed.weight, first in order, too


def test_unknown_names_are_ignored_and_values_take_the_module_dtype():
    m = Tied().to(torch.bfloat16)
    load_state(m, {**_state(0.25), "extra.weight": torch.zeros(1)})
    assert m.mid.weight.dtype == torch.bfloat16 and torch.equal(m.mid.weight, torch.full((2, 2), 0.25, dtype=torch.bfloat16))
