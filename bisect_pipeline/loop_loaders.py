"""The user's loaders while a loop.Session is open: what it keeps of each (Seen), and
what iter() of one returns (LoopIterator): the loader's own batches, counted, until it is
chosen as the training loader; then the experiment's, len(loader) per iter(), so that
the user's epoch ends where it would have (the model trains on them meanwhile: the
experiment changes what it learns from, not how); once the experiment is over and the
loop trains on, the loader's own again. Separate from the session: what a loader is
and how its batches are handed out and counted, whichever loader is chosen.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from torch.utils.data import DataLoader

from .loop_patches import real_iter
from .measure import graph, sources
from .pipeline.integrations import nodes


class Passthrough(Exception):
    """The experiment is over and the loop keeps training on the real loader."""


class Cadence:
    """Pauses of the loop that come every K of the experiment's batches: an evaluation
    loader iterated every K steps (`step % K == 0`). Once two gaps in a row are alike,
    `room()` says how many batches are left before the next one, as the epoch's end is
    known ahead (visit.Visit's `room`): windows then end before it instead of being voided
    by it (at a fast point, every window longer than K steps would be). A pause that does
    not come when due ends the prediction."""

    def __init__(self) -> None:
        self.gaps: list = []  # the last two gaps, in the experiment's batches
        self.since = 0  # the experiment's batches handed since the last pause

    def handed(self) -> None:
        self.since += 1

    def paused(self) -> None:
        if self.since:  # (several loaders iterated in one pause count once)
            self.gaps = (self.gaps + [self.since])[-2:]
        self.since = 0

    def room(self) -> Optional[int]:
        if len(self.gaps) == 2 and self.gaps[0] == self.gaps[1]:
            if self.since < self.gaps[0]:
                return self.gaps[0] - self.since
            self.gaps = []  # it did not come when due
        return None


@dataclasses.dataclass
class Seen:
    """A loader the session saw iterated."""

    index: int  # 1-based, in the order first iterated
    dataset: str
    batch_size: Any
    created_at: Optional[str]
    batches: int = 0  # handed to the loop by its iterators: its own batches and the experiment's
    with_grad: bool = False  # the loop's last request for a batch had grad enabled
    rebuilt: int = 0  # loaders built anew in its place for later epochs (loop.Session._succeed)

    def to_dict(self) -> dict:
        out = {"index": self.index, "dataset": self.dataset, "batch_size": self.batch_size,
               "created_at": self.created_at, "batches": self.batches}
        if self.rebuilt:
            out["rebuilt"] = self.rebuilt
        return out


def data_of(loader: Any) -> Any:
    """What identifies a loader's data across a framework's copies of the loader: a
    DataLoader's dataset; a node graph itself."""
    return loader if nodes.is_graph(loader) else getattr(loader, "dataset", None)


def described(loader: Any) -> tuple:
    """(the name of its data, its batch size) for the report's list of loaders."""
    if nodes.is_graph(loader):
        try:
            spec = nodes.describe(loader)
            return f"{type(loader).__name__} over {spec.settings()['dataset']}", spec.batch_size
        except Exception:
            return type(loader).__name__, None
    return type(getattr(loader, "dataset", None)).__name__, getattr(loader, "batch_size", None)


def epoch_length(loader: Any) -> Optional[int]:
    """The batches after which the loader's own iterator ends an epoch: DataLoader's
    length, not a subclass's __len__ (timm's MultiEpochsDataLoader iterates one endless
    iterator and ends its epochs in its own __iter__, after len(self) batches); None where
    the iterator ends no epoch itself."""
    if nodes.is_graph(loader):  # a node graph's epoch: its source's length through its Batcher, where known
        try:
            return nodes.describe(loader).batches_per_epoch
        except Exception:
            return None
    try:
        return DataLoader.__len__(loader)
    except TypeError:  # an IterableDataset without __len__, an endless batch sampler
        return None


def _close(it: Any, loader: DataLoader) -> None:
    """Shut a loader's own iterator down (its workers; a node graph's threads: its next
    iter() starts them again), and forget it when the loader keeps it for its persistent
    workers, so that a later iter() starts a new one."""
    if nodes.is_graph(loader):
        graph.shutdown(it)
        return
    sources.shutdown(it)
    if getattr(loader, "_iterator", None) is it:
        loader._iterator = None


class LoopIterator:
    """What iter() of a loader returns while a session is open: the loader's own batches
    (`observe`), the experiment's (`experiment`: the chosen loader, len(loader) of them per
    epoch), then, once the experiment is over and the loop goes on, the rest of the epoch
    from the loader itself (`real`)."""

    def __init__(self, session: Any, loader: DataLoader, seen: Seen, real: Any) -> None:
        self.session = session
        self.loader = loader
        self.seen = seen
        self.real = real
        self.mode = "observe" if real is not None else "experiment"
        self.length = epoch_length(loader)
        self.served = 0

    def __iter__(self) -> "LoopIterator":
        return self

    @property
    def ended(self) -> bool:
        """Its epoch has run out: len(loader) batches handed."""
        return self.length is not None and self.served >= self.length

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this loader has no length")
        return self.length

    def __next__(self) -> Any:
        s = self.session
        if self.mode == "observe":
            if s.chosen is not self.loader or s.state == "done":
                batch = self._counted(next(self.real))  # the loader's own; StopIteration: its epoch ended
                s.observed(self.seen)
                return batch
            _close(self.real, self.loader)  # chosen since its last batch: the experiment takes over
            self.real, self.mode = None, "experiment"
        if self.ended:
            if self.mode == "experiment":
                s.epoch_ended()
            raise StopIteration
        if self.mode == "experiment":
            s.epoch = self
            try:
                batch = s.next_batch()
            except Passthrough:
                self.real, self.mode = real_iter(self.loader), "real"
            else:
                s.cadence.handed()
                return self._counted(batch)
        return self._counted(next(self.real))

    def _counted(self, batch: Any) -> Any:
        self.served += 1
        self.seen.batches += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        """What code that holds the iterator reads of the loader's own (a framework's
        fetcher): from the loader's real iterator, where there is one."""
        real = self.__dict__.get("real")
        if real is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(real, name)

