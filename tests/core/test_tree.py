"""The one walker over batches (tree.py), on every batch structure the README lists:
tuples, dicts, namedtuples, dataclasses, nested lists, custom batch classes, padding
collates (token ids + lengths); plus mapping subclasses and the depth limit."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from bisect_pipeline.core import tree

Pair = collections.namedtuple("Pair", ["image", "label"])


@dataclasses.dataclass
class Batch:
    features: torch.Tensor
    labels: torch.Tensor
    note: str = "x"


@dataclasses.dataclass
class WithDerived:
    x: torch.Tensor
    n: int = dataclasses.field(init=False, default=0)


class CustomBatch:
    def __init__(self, inp, tgt):
        self.inp, self.tgt = inp, tgt

    def to(self, device, non_blocking=False):
        return CustomBatch(self.inp.to(device), self.tgt.to(device))


def t(*shape):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape)


STRUCTURES = {
    "tensor": t(2, 3),
    "tuple": (t(2, 3), torch.tensor([0, 1])),
    "dict": {"inputs": t(2, 3), "targets": torch.tensor([0, 1]), "ids": ["a", "b"]},
    "namedtuple": Pair(t(2, 3), torch.tensor([0, 1])),
    "dataclass": Batch(t(2, 3), torch.tensor([0, 1])),
    "nested list": [[t(2), t(2)], [t(2), (t(1), {"k": t(3)})]],
    "custom batch": CustomBatch(t(2, 3), torch.tensor([0, 1])),
    "padding collate": (torch.zeros(2, 5, dtype=torch.long), torch.tensor([5, 3]), torch.tensor([1, 0])),
    "ordered dict": collections.OrderedDict(a=t(2), b=t(3)),
    "defaultdict": collections.defaultdict(list, a=t(2)),
}


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_map_leaves_rebuilds_every_structure_with_its_types(name):
    batch = STRUCTURES[name]
    doubled = tree.map_leaves(lambda x: x * 2 if isinstance(x, torch.Tensor) else x, batch)
    assert type(doubled) is type(batch)
    before, after = list(tree.leaves(batch)), list(tree.leaves(doubled))
    assert [p for p, _ in before] == [p for p, _ in after]  # same paths, same order
    for (_, a), (_, b) in zip(before, after):
        if isinstance(a, torch.Tensor):
            assert torch.equal(b, a * 2) and b is not a
        else:
            assert b == a
    # the original is untouched
    assert all(not isinstance(x, torch.Tensor) or torch.equal(x, y)
               for (_, x), (_, y) in zip(tree.leaves(batch), before))


def test_leaves_give_paths_that_replace_and_find_agree_on():
    batch = STRUCTURES["nested list"]
    for path, leaf in tree.leaves(batch):
        assert tree.find(batch, leaf) == path
        swapped = tree.replace(batch, path, "X")
        assert dict(tree.leaves(swapped))[path] == "X"
        assert dict(tree.leaves(batch))[path] is leaf


def test_custom_batch_objects_and_dataclasses_are_containers_leaves_are_not():
    assert tree.is_batch_object(STRUCTURES["custom batch"])
    for leaf in (t(2), "text", 3, None, torch.nn.Linear(2, 2)):
        assert not tree.is_container(leaf) and tree.children(leaf) == []
    d = WithDerived(t(2))
    d.n = 5
    out = tree.map_leaves(lambda x: x, d)
    assert out.n == 5  # a field outside __init__ is carried over


def test_the_depth_limit_stops_a_self_reference():
    loop: list = [t(1)]
    loop.append(loop)
    found = list(tree.leaves(loop))
    assert len(found) <= tree.MAX_DEPTH + 2
    assert tree.map_leaves(lambda x: x, loop) is not None


def test_replace_refuses_a_missing_key():
    with pytest.raises(KeyError):
        tree.replace({"a": 1}, ("b",), 2)
    for seq, key in (((1, 2), 2), ([1, 2], -1), ((1, 2), "0")):  # a tuple's or list's keys are its indices
        with pytest.raises(KeyError):
            tree.replace(seq, (key,), 0)


def test_replace_in_a_plain_tuple_or_list_keeps_its_type_and_leaves_the_original():
    sample = (t(2), 7)
    new = tree.replace(sample, (0,), "X")
    assert new == ("X", 7) and type(new) is tuple and sample[1] == 7 and isinstance(sample[0], torch.Tensor)
    nested = [(1, [2, 3]), 4]
    assert tree.replace(nested, (0, 1, 0), 9) == [(1, [9, 3]), 4] and nested == [(1, [2, 3]), 4]


def test_same_structure_accepts_what_a_transform_accepts():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6)).save(buf, format="JPEG")
    decoded = Image.open(io.BytesIO(buf.getvalue()))  # a JpegImageFile, as datasets' Image feature gives
    assert type(decoded).__name__ == "JpegImageFile"
    assert tree.same_structure({"image": decoded}, {"image": tree.clone(decoded)}) is None  # its copy is a plain Image
    assert "image RGB" in tree.same_structure(decoded, Image.new("L", (8, 6)))
    assert "image RGB (8, 6) vs RGB (4, 4)" in tree.same_structure(decoded, Image.new("RGB", (4, 4)))

    class Sub(dict):
        pass

    assert tree.same_structure(Sub(a=t(2)), {"a": t(2)}) is None
    assert tree.same_structure((t(2),), [t(2)]) is not None  # a tuple is not a list


def test_same_structure_names_the_difference():
    assert tree.same_structure((torch.zeros(2), 1), (torch.zeros(3), 2)) is None  # shapes may vary
    assert "float32" in tree.same_structure((torch.zeros(2),), (torch.zeros(2, dtype=torch.int64),))
    assert tree.same_structure({"a": 1}, {"b": 1}) is not None


def test_set_path_rebuilds_containers():
    Pair = collections.namedtuple("Pair", "x y")

    @dataclasses.dataclass
    class Box:
        v: object

    obj = [Pair(1, {"k": Box(5)})]
    new = tree.replace(obj, (0, 1, "k", "v"), 9)
    assert new[0].y["k"].v == 9 and obj[0].y["k"].v == 5
    assert isinstance(new[0], Pair)


def test_clone_data_shares_no_storage():
    t = torch.ones(3)
    c = tree.clone({"a": [t, (t, 1)]})
    c["a"][0].add_(1)
    assert torch.equal(t, torch.ones(3))


def test_nbytes_and_leading_dim():
    batch = {"x": torch.zeros(8, 4), "y": torch.zeros(8, dtype=torch.int64)}
    assert tree.nbytes(batch) == 8 * 4 * 4 + 8 * 8
    assert tree.leading_dim(batch) == 8
    assert tree.shared_leading_dim(batch) == 8
    assert tree.shared_leading_dim({**batch, "lengths": torch.zeros(5)}) is None  # the tensors disagree
    assert tree.shared_leading_dim({"n": 3, "s": torch.tensor(1.0)}) is None  # no tensor with a dimension
