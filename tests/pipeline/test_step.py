"""The default training step and the default transfer of a batch (step.py)."""

import collections
import dataclasses

import pytest
import torch

from bisect_pipeline import BisectError
from bisect_pipeline.pipeline import step as step_mod
from bisect_pipeline.pipeline.step import default_step, make_step, split_batch, to_device
from conftest import tiny_model


def test_split_batch_tuple_and_dict():
    x, y = torch.zeros(2), torch.ones(2)
    assert split_batch((x, y))[1] is y
    assert split_batch({"image": x, "label": y})[0] is x
    with pytest.raises(BisectError, match="own step"):
        split_batch({"a": x})


def test_default_step_trains():
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.clone() for p in model.parameters()]
    default_step(model, opt, torch.nn.CrossEntropyLoss())((torch.randn(4, 16), torch.tensor([0, 1, 2, 3])))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_to_device_keeps_structure():
    Pair = collections.namedtuple("Pair", "x y")

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        meta: str

    class Custom:
        def __init__(self):
            self.moved_to = None

        def to(self, device):
            self.moved_to = device
            return self

    cpu = torch.device("cpu")
    custom = Custom()
    out = to_device({"p": Pair(torch.zeros(1), [torch.ones(1)]), "b": Batch(torch.zeros(1), "m"), "c": custom,
                     "s": "keep"}, cpu)
    assert isinstance(out["p"], Pair) and isinstance(out["p"].y, list)
    assert isinstance(out["b"], Batch) and out["b"].meta == "m"
    assert out["c"].moved_to == cpu and out["s"] == "keep"


class CustomBatch:
    def __init__(self):
        self.inp = torch.zeros(2, 3)
        self.seen: list = []

    def to(self, device, non_blocking=False):
        self.seen.append((str(device), non_blocking))
        return self


class OldStyleBatch:
    def __init__(self):
        self.inp = torch.zeros(2)
        self.seen: list = []

    def to(self, device):  # no non_blocking argument
        self.seen.append(str(device))
        return self


def test_a_custom_batch_moves_itself_non_blocking_to_an_accelerator():
    b = CustomBatch()
    step_mod.to_device({"batch": b}, torch.device("cuda"))  # nothing touches CUDA: the batch moves itself
    assert b.seen == [("cuda", True)]
    old = OldStyleBatch()
    step_mod.to_device(old, torch.device("cuda"))
    assert old.seen == ["cuda"]
    step_mod.to_device(b, torch.device("cpu"))
    assert b.seen[-1] == ("cpu", False)


def test_a_model_with_nothing_to_train_needs_its_own_step():
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(BisectError, match="no trainable parameter"):
        make_step(model)
    mine = lambda batch: None  # noqa: E731
    assert make_step(model, step=mine) is mine
