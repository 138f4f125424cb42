import pytest
import torch

from bisect_pipeline import BisectError, Workload
from bisect_pipeline.pipeline.workload import as_workload
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


