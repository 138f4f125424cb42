import collections
import dataclasses

import pytest
import torch

from bisect_pipeline import BisectError, Workload
from bisect_pipeline.step import default_step, split_batch, to_device
from bisect_pipeline.workload import as_workload
from conftest import PlantedDataset, make_loader, tiny_model


def test_accepts_workload_dict_and_tuple():
    model, loader = tiny_model(), make_loader(PlantedDataset())
    assert as_workload(Workload(model, loader)).model is model
    assert as_workload({"model": model, "loader": loader}).loader is loader
    assert as_workload((model, loader)).model is model


@pytest.mark.parametrize("bad,match", [
    (42, "must return"),
    ({"model": None}, "without a 'loader'"),
    ({"loader": None, "modle": 1}, "unknown key"),
])
def test_rejects_bad_returns_with_the_contract(bad, match):
    with pytest.raises(BisectError, match=match):
        as_workload(bad)


def test_rejects_a_non_dataloader():
    with pytest.raises(BisectError, match="not a torch.utils.data.DataLoader"):
        as_workload((tiny_model(), [1, 2]))


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
