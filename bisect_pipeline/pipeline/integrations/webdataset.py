"""webdataset: a `WebDataset` or `DataPipeline` keeps its stages as objects in a list
(`self.pipeline`), so its points are cuts in that list:

    shards ─read─▶ tar samples ─decode─▶ raw ─map/to_tuple─▶ augmented ─batched─▶ collated

`raw` falls after the last `decode` stage (load = reading and decoding), `augmented`
before the first `batched` stage (or at the dataset's end when the DataLoader batches),
and `collated` is the loader's output as everywhere. The fill runs a copy of the
pipeline with a tap at each cut (`Cuts.tapped`), which keeps the items passing there; a
cut's replay is the same pipeline class over those items, cycled, followed by the very
stage objects after the cut (`Cuts.replay`), in the user's DataLoader settings: every
worker cycles over the cached items. The stages alone (worker_stages.py) are the same
segments run on cached items (`Cuts.loading`, `augmenting`, `collating`).

A `WebLoader` is a DataPipeline whose first stage is a DataLoader: the stages after it
(`.unbatched().shuffle(10).batched(64)`) run in the training loop's own process, on
every batch at every point. `LoopStages` runs them over a point's batches (--entry) and
times them alone on cached batches: their own line in the report, never a stage of the
bisection nor the step.

Stages are recognised by the names of their functions (webdataset's `FilterFunction`
holds `_map`, `_decode`, `_batched`, ...): nothing is imported from webdataset here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
from typing import Any, Callable, Iterator, Optional

from ...core import tree
from .. import recording
from ._common import by_name

# Functions that read shards into samples of raw bytes (tariterators.py, cache.py,
# shardlists.py): everything up to the last of them is reading.
READ_STAGES = ("tar_file_expander", "group_by_keys", "tarfile_samples", "tarfile_to_samples", "url_opener",
               "tar_file_iterator", "check_empty", "cached_tarfile_samples", "cached_url_opener", "StreamingOpen",
               "FileCache", "lru_cleanup")
DECODE_STAGES = ("_decode", "_xdecode")
MAP_STAGES = ("_map", "_map_dict", "_map_tuple", "_to_tuple", "_rename", "_rename_keys", "_extract_keys")
BATCH_STAGES = ("_batched",)


def is_pipeline(obj: Any) -> bool:
    return by_name(obj, ("webdataset",), ("DataPipeline",))


def is_webloader(obj: Any) -> bool:
    """A DataPipeline whose first stage is a torch DataLoader (webdataset's WebLoader, or
    a DataPipeline built around a loader by hand)."""
    import torch

    stages = getattr(obj, "pipeline", None) if is_pipeline(obj) else None
    return bool(stages) and isinstance(stages[0], torch.utils.data.DataLoader)


def _function(stage: Any) -> Any:
    """The function a stage runs: a FilterFunction's `f`, else the stage itself."""
    return stage.f if type(stage).__name__ == "FilterFunction" and hasattr(stage, "f") else stage


def stage_name(stage: Any) -> str:
    """How the report names a stage: `map(augment)`, `decode`, `batched(64)`, `shuffle`."""
    f = _function(stage)
    name = getattr(f, "__name__", type(f).__name__)
    if kind(stage) == "decode":
        return "decode"
    args = getattr(stage, "args", ()) or ()
    if name == "_map" and args:
        return f"map({getattr(args[0], '__name__', type(args[0]).__name__)})"
    if name == "_batched":
        size = args[0] if args else getattr(stage, "kw", {}).get("batchsize", 20)
        return f"batched({size})"
    return name.lstrip("_")


def kind(stage: Any) -> str:
    """read, decode, map, batch, or other (shuffles, selects, shard lists, splitters)."""
    f = _function(stage)
    name = getattr(f, "__name__", type(f).__name__)
    if name in DECODE_STAGES:
        return "decode"
    if name == "_map":
        args = getattr(stage, "args", ()) or ()
        fn = args[0] if args else getattr(stage, "kw", {}).get("f")
        return "decode" if by_name(fn, ("webdataset",), ("Decoder",)) else "map"
    if name in MAP_STAGES:
        return "map"
    if name in BATCH_STAGES:
        return "batch"
    if name in READ_STAGES:
        return "read"
    return "other"


def batch_size(stage: Any) -> Optional[int]:
    """The batch size of a `batched` stage."""
    args = getattr(stage, "args", ()) or ()
    size = args[0] if args else getattr(stage, "kw", {}).get("batchsize", 20)
    return int(size) if isinstance(size, int) else None


class Tap:
    """A stage inserted at a cut during the fill: keeps (a copy of) each item passing,
    up to `limit`, and hands it on unchanged."""

    def __init__(self, limit: int) -> None:
        self.items: list = []
        self.limit = limit

    def __call__(self, source: Iterator) -> Iterator:
        for item in source:
            if len(self.items) < self.limit:
                self.items.append(tree.clone(item))
            yield item


class Cycle:
    """The first stage of a replay: the cached items, cycled forever, each a fresh copy
    (a later stage may change a sample in place: `map_dict` does); invoked with no
    argument, as DataPipeline invokes its first stage."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __call__(self) -> Iterator:
        return (fresh(item) for item in itertools.cycle(self.items))


def fresh(item: Any) -> Any:
    """`item` with its containers new and its tensors and arrays copied (PIL images and
    bytes are replaced, not changed, by what follows)."""
    return tree.map_leaves(_fresh_leaf, item)


def _fresh_leaf(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.clone()
    return x.copy() if (type(x).__module__ or "").startswith("numpy") and hasattr(x, "copy") else x


def run(stages: list, items: Iterator) -> list:
    """What `stages` (DataPipeline stage objects) make of `items`, drained."""
    source = items
    for stage in stages:
        source = stage.run(source) if hasattr(stage, "run") and not callable(stage) else stage(source)
    return list(source)


def _with_stages(pipeline: Any, stages: list) -> Any:
    """A copy of the user's pipeline object (its class and settings: repetitions,
    with_epoch) whose stage list is `stages`."""
    out = copy.copy(pipeline)
    out.pipeline = list(stages)
    return out


def _copied_stages(pipeline: Any) -> list:
    """The stage list, deep-copied where it can be (a `detshuffle` counts its epochs: the
    tool's iterations must not advance the user's), else the same objects."""
    try:
        return copy.deepcopy(list(pipeline.pipeline))
    except Exception:
        return list(pipeline.pipeline)


@dataclasses.dataclass
class Cuts:
    """Where a DataPipeline's points fall (indices into its stage list: the items before
    stage i are cut i) and, once filled, the items the fill kept at each cut."""

    pipeline: Any  # the user's DataPipeline (never iterated)
    stages: list  # a copy of its stage list
    raw: int  # the first stage after loading: items before it are `raw`
    augmented: int  # the first batched stage (or len(stages)): items before it are `augmented`
    taps: dict = dataclasses.field(default_factory=dict)  # cut -> Tap, from the first candidate for raw to augmented
    items_per_output: int = 1  # samples in one item the dataset yields (batched(n): n)
    loaded_by: str = "decode"  # what ends loading, as the report says it

    @property
    def tapped(self) -> Any:
        """The pipeline the fill runs: the stages, a tap at each cut considered."""
        stages = list(self.stages)
        for at in sorted(self.taps, reverse=True):
            stages.insert(at, self.taps[at])
        return _with_stages(self.pipeline, stages)

    @property
    def full(self) -> Any:
        """The copy that runs `full`: the stages as they are, no tap."""
        return _with_stages(self.pipeline, self.stages)

    @property
    def has_raw(self) -> bool:
        return self.raw < self.augmented

    def settle(self, samples: int) -> Optional[str]:
        """After the fill: `raw` at the first cut whose items are decoded (a map stage
        handed encoded bytes only decodes them: it loads, as a loader called with a
        path does in a map-style dataset); the items kept at each cut trimmed to as many
        as the cached batches hold samples (a shuffle buffer reads further ahead). None,
        or why `raw` is not apart from `augmented`."""
        for at in sorted(self.taps):
            items = self.taps[at].items
            if at >= self.augmented or (items and not recording.names_only(items[0])):
                self.raw = at
                break
            self.loaded_by = f"{stage_name(self.stages[at])} (handed encoded bytes: it decodes)"
        for tap in self.taps.values():
            del tap.items[max(1, samples):]
        self.taps = {at: tap for at, tap in self.taps.items() if at in (self.raw, self.augmented)}
        if self.has_raw:
            return None
        return ("the dataset is an IterableDataset (a webdataset pipeline) whose stages after reading decode the "
                "tar's bytes and leave no stage that transforms decoded samples apart from batching: loading and "
                "the transforms are one. Decode with `.decode(...)` and transform with `.map(...)` after it to "
                "separate them")

    def items(self, name: str) -> list:
        return self.taps[self.raw if name == "raw" else self.augmented].items

    def replay(self, name: str) -> Any:
        """The IterableDataset of point `name` (raw or augmented): its cached items,
        cycled, through the stages after its cut."""
        at = self.raw if name == "raw" else self.augmented
        return _with_stages(self.pipeline, [Cycle(self.items(name)), *self.stages[at:]])

    def found(self) -> list:
        """The transforms `raw` replays, as the report lists them."""
        return [f"dataset.pipeline[{i}] {stage_name(s)}" for i, s in enumerate(self.stages)
                if self.raw <= i < self.augmented and kind(s) == "map"]

    # -- the segments timed alone (worker_stages.py) -----------------------------------

    def loading(self) -> Any:
        """A pipeline of the stages up to `raw`: iterating it reads and decodes samples."""
        return _with_stages(self.pipeline, _copied_list(self.stages[:self.raw]))

    def augmenting(self) -> tuple[list, Callable[[Any], Any]]:
        """(items, fn): the stages from `raw` to `augmented` on one cached raw item."""
        stages = self.stages[self.raw:self.augmented]
        return self.items("raw"), lambda item: run(stages, iter([fresh(item)]))

    def collating(self, collate_fn: Callable, loader_batch: Optional[int]) -> tuple[list, Callable[[Any], Any]]:
        """(groups, fn): what makes one batch of the loader from the augmented items: the
        stages from `augmented` on (`batched`), then the DataLoader's collate_fn (its
        batches of `loader_batch` outputs, or each output converted)."""
        stages = self.stages[self.augmented:]
        items = self.items("augmented")
        per = self.items_per_output * (loader_batch or 1)
        groups = [items[i:i + per] for i in range(0, len(items) - per + 1, per)] or [items]

        def one(group: list) -> Any:
            outs = run(stages, iter(group))
            return collate_fn(outs) if loader_batch else [collate_fn(o) for o in outs]
        return groups, one

    def nbytes(self) -> int:
        return sum(tree.nbytes(x) + _bytes_in(x) for tap in self.taps.values() for x in tap.items)


def _bytes_in(item: Any) -> int:
    return sum(len(x) for _, x in tree.leaves(item) if isinstance(x, (bytes, bytearray)))


def cuts(dataset: Any, limit: int) -> tuple[Optional[Cuts], Optional[str]]:
    """(cuts, None) for a DataPipeline whose stages can be cut into loading, transforms and
    batching, else (None, why not), or (None, None) for another dataset. `raw` is settled
    after the fill (Cuts.settle); `limit`: the most items a tap keeps."""
    if not is_pipeline(dataset):
        return None, None
    stages = _copied_stages(dataset)
    kinds = [kind(s) for s in stages]
    read = max((i + 1 for i, k in enumerate(kinds) if k == "read"), default=0)
    decoded = [i for i, k in enumerate(kinds) if k == "decode"]
    first = max(decoded) + 1 if decoded else read
    batches = [i for i, k in enumerate(kinds) if k == "batch" and i >= first]
    augmented = batches[0] if batches else len(stages)
    if any(k == "batch" for k in kinds[:first]):
        return None, ("its samples are batched before they are decoded (a `batched` stage before `decode`), so "
                      "the decoded samples are never apart from their batches")
    if read == 0 and not decoded:
        return None, ("none of its stages reads shards as webdataset does (tarfile_to_samples, "
                      "tar_file_expander) and none decodes: its stages could not be told apart")
    out = Cuts(dataset, stages, first, augmented, loaded_by="decode" if decoded else "reading")
    # candidates for raw: the cut after decoding (or reading), and after each map stage up to augmented
    out.taps = {at: Tap(limit) for at in range(first, augmented + 1) if at == first or kinds[at - 1] == "map"
                or at == augmented}
    if batches:
        out.items_per_output = batch_size(stages[augmented]) or 1
    return out, None


# --------------------------------------------------------------------------------------
# WebLoader: stages in the training loop's own process
# --------------------------------------------------------------------------------------


class LoopStages:
    """The stages a WebLoader runs after its DataLoader, in the loop's process."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.stages = list(pipeline.pipeline[1:])

    @property
    def label(self) -> str:
        return "WebLoader: " + ", ".join(stage_name(s) for s in self.stages)

    @property
    def loader(self) -> Any:
        return self.pipeline.pipeline[0]

    def chain(self, batches: Iterator) -> Iterator:
        """The user's WebLoader (its class and settings) over `batches` instead of its
        DataLoader: the stages after it, run on them."""
        return iter(_with_stages(self.pipeline, [lambda: batches, *_copied_list(self.stages)]))

    @contextlib.contextmanager
    def through(self, source: Any) -> Iterator[Callable[[], Any]]:
        """A point's batch source (a context manager yielding next_batch) seen through the
        loop's stages, as the user's loop sees the WebLoader's batches."""
        with source as next_batch:
            def batches():
                while True:
                    yield next_batch()
            yield self.chain(batches()).__next__

    def timing(self, batches: list) -> tuple[list, Callable[[Any], Any]]:
        """(items, fn): one call of fn makes one batch out of the stages, fed with the
        cached batches cycled (copies: `unbatched` hands on views of them)."""
        it = self.chain(fresh(b) for b in itertools.cycle(batches))
        return list(range(max(2, len(batches) + 1))), lambda _: next(it)


def _copied_list(stages: list) -> list:
    try:
        return copy.deepcopy(stages)
    except Exception:
        return list(stages)


def adapt(wl: Any, where: str) -> None:
    """A WebLoader handed as the loader: its DataLoader becomes the workload's loader, the
    stages after it the loop stages every point's batches go through."""
    wl.loop_stages = LoopStages(wl.loader)
    wl.loader = wl.loop_stages.loader


def loop_stages_of(loader: Any, frame: Any) -> Optional[LoopStages]:
    """Under `run`: the WebLoader iterating `loader` (its first stage), found in the
    frames that called iter() on it (DataPipeline.invoke's `self`), or None."""
    f = frame
    for _ in range(8):
        if f is None:
            return None
        owner = f.f_locals.get("self")
        if owner is not None and is_webloader(owner) and owner.pipeline[0] is loader and len(owner.pipeline) > 1:
            return LoopStages(owner)
        f = f.f_back
    return None
