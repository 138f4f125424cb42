"""Finding the dataset's transforms to proxy (split.py); recording and replaying them:
test_recording.py."""

import torch
from torch.utils.data import ConcatDataset, Subset

from bisect_pipeline import recording, split
from conftest import PlantedDataset
from test_recording import Double


def test_transform_found_through_subset_and_concat():
    inner = PlantedDataset(transform=Double())
    chain = Subset(ConcatDataset([PlantedDataset(), inner]), [70])
    inst = split.instrument(chain)
    assert inst.found == ["dataset.dataset.datasets[1].transform (Double)"]
    sample, calls = recording.record_sample(inst, 0)
    assert torch.equal(sample[0], inner.data[70 - 64] * 2)
    assert len(calls) == 1


