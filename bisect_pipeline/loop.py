"""Your own training loop as the step: `bisect-pipeline run train.py`, `watching()`,
`watch(loader)`.

The experiment is the one `--entry` runs (phases.measure: the same caches, replays,
visits, rounds, verdict, advice and report); only the driver differs. Here the user's
loop drives: the training loader's iterator is replaced by one that hands the loop the
batches of each visit in turn, and the time between two of its requests is its step,
whatever it does around the model (logging, metric syncs, accumulation, AMP, EMA, a
scheduler).

How it attaches, with no change to the user's code, while a Session is open:

- DataLoader.__init__ and __iter__ are patched at the class level (frameworks build
  loaders of their own: Lightning re-instantiates the user's, accelerate's
  DataLoaderShard calls its base loader's __iter__), and a global optimizer-step hook
  is registered;
- the training loader is the first loader iterated with grad enabled whose consumer
  takes an optimizer step between two of its batches (an evaluation loader, under
  no_grad or inference_mode, is never chosen); `loader=N` picks the N-th loader
  iterated instead;
- until then every loader yields its own batches; once chosen, its iterator's workers
  are shut down and the experiment starts inside the loop's next request.

Epochs: each iter() of the training loader gives len(loader) batches, so the user's
epoch ends where it would have; the experiment goes on in the next epoch's iterator, or
in a loader built anew for the next epoch at the same line (Session._may_succeed: it takes
over at the loop's first optimizer step on it, as the first one was chosen). An
epoch's end, another loader iterated, or a pause far beyond a step voids the window under
way (visit.Visit): discarded and counted. The pauses are the run's time all the same:
--max-seconds bounds the run's wall time, the loop's evaluations included (a script
whose evaluations fill the budget is told so, with the seconds they took).

When the verdict is in, the report goes to `on_report`, and the loop is stopped with
ScriptStopped (a BaseException: the script's finally blocks run), or, with
`keep_training`, handed back to the real loader. The model trains on the cached batches
meanwhile: the experiment changes what it learns from, not how.

Why one module: one session in the user's own loop: the class-level patches, the
loader's stand-in and the script's length all act while the session is open and share
its state.
"""

from __future__ import annotations

import argparse
import dataclasses
import dis
import gc
import importlib.util
import linecache
import os
import site
import sys
import sysconfig
import time
import weakref
from typing import Any, Callable, Iterator, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from . import api, loop_target, phases
from .advise import change
from .core import faults
from .core.errors import BisectError
from .core.results import Measurements, PointResult
from .derive.drops import POINTS
from .measure import allocator, devices, distributed, graph, sources
from .phases import Options
from .pipeline.integrations import nodes, webdataset
from .pipeline.step import to_device
from .report import Report
from .report.ranks import combine

# A loop with no training loader chosen is told it waits after this share of --max-seconds
# (6 s at the default 60): a loop that accumulates gradients takes several batches before
# its first step, at which its loader is chosen, and a short script with no loader ends
# with its one paragraph alone.
SAY_WAITING_SHARE = 0.1

# Frames of these packages are not where a loader is created: its creator is the first
# frame outside them (the user's script).
_FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "accelerate", "transformers", "bisect_pipeline", "runpy")


class ScriptStopped(BaseException):
    """Raised in the user's loop once the report is made: it stops the script cleanly.
    A BaseException, so that the script's `except Exception` does not swallow it."""

    def __init__(self, report: Optional[Report] = None, error: Optional[BaseException] = None) -> None:
        super().__init__("bisect-pipeline has its verdict: the script is stopped")
        self.report = report
        self.error = error


class _Passthrough(Exception):
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
    rebuilt: int = 0  # loaders built anew in its place for later epochs (Session._succeed)

    def to_dict(self) -> dict:
        out = {"index": self.index, "dataset": self.dataset, "batch_size": self.batch_size,
               "created_at": self.created_at, "batches": self.batches}
        if self.rebuilt:
            out["rebuilt"] = self.rebuilt
        return out


# --------------------------------------------------------------------------------------
# The patches (class level, while a session is open)
# --------------------------------------------------------------------------------------

_SESSIONS: list = []  # open sessions, innermost last
_ORIGINAL: dict = {}


def _current() -> Optional["Session"]:
    return _SESSIONS[-1] if _SESSIONS else None


def _patched_init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL["init"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy:
        s.created(self)


def _patched_iter(self: DataLoader) -> Any:
    s = _current()
    if s is None or s.busy:
        return _ORIGINAL["iter"](self)
    if "webdataset" in sys.modules and self not in s.loop_stages:  # iterated by a WebLoader?
        s.loop_stages[self] = webdataset.loop_stages_of(self, sys._getframe(1))
    return s.iterate(self)


def _patched_graph_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """tn.Loader.__init__ and BaseNode.__init__: where a node graph's loader (a Loader, a
    root node) was created."""
    _ORIGINAL["loader init" if nodes.is_loader(self) else "node init"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy and type(self).__name__ != "LoaderIterator":
        s.created(self)


def _patched_loader_iter(self: Any) -> Any:
    s = _current()
    if s is None or s.busy or sys._getframe(1).f_code.co_name == "state_dict":  # (Loader.state_dict's own iter())
        return _ORIGINAL["loader iter"](self)
    return s.iterate(self)


def _patched_node_iter(self: Any) -> Any:
    """BaseNode.__iter__ (it returns the node): a root node the loop iterates itself."""
    s = _current()
    if s is None or s.busy or type(self).__name__ == "LoaderIterator":
        return self
    return s.iterate(self)


def _on_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    s = _current()
    if s is not None and not s.busy:
        s.optimizer_stepped(optimizer)


def _patched_parse_known_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
    out = _ORIGINAL["parse"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy and isinstance(out, tuple) and out:
        s.parsed(out[0])
    return out


def _install() -> None:
    if _ORIGINAL:
        return
    _ORIGINAL.update(init=DataLoader.__init__, iter=DataLoader.__iter__,
                     parse=argparse.ArgumentParser.parse_known_args,
                     hook=register_optimizer_step_post_hook(_on_optimizer_step),
                     undo=faults.undo_in_child(_forget_in_child))
    DataLoader.__init__ = _patched_init
    DataLoader.__iter__ = _patched_iter
    argparse.ArgumentParser.parse_known_args = _patched_parse_known_args
    tn = _torchdata_nodes()
    if tn is not None:
        _ORIGINAL.update({"loader init": tn.Loader.__init__, "loader iter": tn.Loader.__iter__,
                          "node init": tn.BaseNode.__init__, "node iter": tn.BaseNode.__iter__})
        tn.Loader.__init__ = _patched_graph_init
        tn.Loader.__iter__ = _patched_loader_iter
        tn.BaseNode.__init__ = _patched_graph_init
        tn.BaseNode.__iter__ = _patched_node_iter


def _torchdata_nodes() -> Any:
    """torchdata.nodes where it is installed (patched like DataLoader), else None."""
    try:
        if importlib.util.find_spec("torchdata") is None:
            return None
        import torchdata.nodes as tn
    except Exception:  # a broken install: its loaders are then iterated as they are
        return None
    return tn


def _uninstall() -> None:
    if not _ORIGINAL or _SESSIONS:
        return
    DataLoader.__init__ = _ORIGINAL.pop("init")
    DataLoader.__iter__ = _ORIGINAL.pop("iter")
    argparse.ArgumentParser.parse_known_args = _ORIGINAL.pop("parse")
    if "loader init" in _ORIGINAL:
        tn = _torchdata_nodes()
        tn.Loader.__init__, tn.Loader.__iter__ = _ORIGINAL.pop("loader init"), _ORIGINAL.pop("loader iter")
        tn.BaseNode.__init__, tn.BaseNode.__iter__ = _ORIGINAL.pop("node init"), _ORIGINAL.pop("node iter")
    _ORIGINAL.pop("hook").remove()
    faults.forget_in_child(_ORIGINAL.pop("undo"))


def _forget_in_child() -> None:
    """In a process forked from the session's (a DataLoader worker): the patches and
    os._exit as they were before any session, and no session open."""
    if _SESSIONS and _SESSIONS[0]._exit is not None:
        os._exit = _SESSIONS[0]._exit
    _SESSIONS.clear()
    _uninstall()


def real_iter(loader: Any) -> Any:
    """The loader's own iterator, patched or not (a root node is its own iterator)."""
    if nodes.is_loader(loader):
        return _ORIGINAL.get("loader iter", type(loader).__iter__)(loader)
    if nodes.is_node(loader):
        return loader
    return _ORIGINAL.get("iter", DataLoader.__iter__)(loader)


def _data_of(loader: Any) -> Any:
    """What identifies a loader's data across a framework's copies of the loader: a
    DataLoader's dataset; a node graph itself."""
    return loader if nodes.is_graph(loader) else getattr(loader, "dataset", None)


def _described(loader: Any) -> tuple:
    """(the name of its data, its batch size) for the report's list of loaders."""
    if nodes.is_graph(loader):
        try:
            spec = nodes.describe(loader)
            return f"{type(loader).__name__} over {spec.settings()['dataset']}", spec.batch_size
        except Exception:
            return type(loader).__name__, None
    return type(getattr(loader, "dataset", None)).__name__, getattr(loader, "batch_size", None)


def _creation_site(loader: DataLoader) -> Optional[str]:
    """file:line where the user's code created the loader: the first frame outside the
    standard library, installed packages (a library's DataLoader subclass calling
    super().__init__), torch, the frameworks and this package, and outside the loader's
    own __init__ chain (a subclass in the user's code: where it is instantiated)."""
    skipped = _skipped_dirs()
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if (not f.f_code.co_filename.startswith("<") and not path.startswith(skipped)
                and f.f_locals.get("self") is not loader):
            return f"{path}:{f.f_lineno}"
        f = f.f_back
    return None


def _skipped_dirs() -> tuple:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    dirs = [os.path.abspath(d) + os.sep for d in dirs]
    for name in _FRAMEWORKS:
        m = sys.modules.get(name)
        dirs.extend(os.path.abspath(p) + os.sep for p in (getattr(m, "__path__", None) or ()))
    return tuple(dirs)


def _length(loader: Any) -> Optional[int]:
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


# What a script's command line calls the epochs it trains for (argparse's dest), and
# the first of them where it resumes (torchvision's references, timm: --start-epoch).
_EPOCHS = ("epochs", "num_epochs", "n_epochs", "nepochs", "max_epochs", "total_epochs", "train_epochs",
           "num_train_epochs", "epoch")
_START_EPOCH = ("start_epoch", "begin_epoch")


def epochs_asked(namespace: Any) -> Optional[int]:
    """The epochs a script's parsed command line asks for (its argparse Namespace), less
    the one it starts from; None where it names none."""
    values = vars(namespace) if namespace is not None and hasattr(namespace, "__dict__") else {}
    epochs = next((v for k in _EPOCHS if isinstance(v := values.get(k), int) and not isinstance(v, bool)
                   and v > 0), None)
    if epochs is None:
        return None
    first = next((v for k in _START_EPOCH if isinstance(v := values.get(k), int) and not isinstance(v, bool)), 0)
    return max(1, epochs - max(0, first))


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


def _param_device(optimizer: torch.optim.Optimizer) -> Optional[torch.device]:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return None


def _joinables() -> list:
    """The DDP modules (and other Joinables) of this process: a lockstep unit runs under
    Join over them (distributed.Coordinator), which the user's loop cannot hand over."""
    from torch.distributed.algorithms.join import Joinable

    return [o for o in gc.get_objects() if isinstance(o, Joinable)]


class LoopIterator:
    """What iter() of a loader returns while a session is open: the loader's own batches
    (`observe`), the experiment's (`experiment`: the chosen loader, len(loader) of them per
    epoch), then, once the experiment is over and the loop goes on, the rest of the epoch
    from the loader itself (`real`)."""

    def __init__(self, session: "Session", loader: DataLoader, seen: Seen, real: Any) -> None:
        self.session = session
        self.loader = loader
        self.seen = seen
        self.real = real
        self.mode = "observe" if real is not None else "experiment"
        self.length = _length(loader)
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
                batch = next(self.real)  # the loader's own batches; StopIteration: its epoch ended
                self.served += 1
                self.seen.batches += 1
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
            except _Passthrough:
                self.real, self.mode = real_iter(self.loader), "real"
            else:
                self.served += 1
                self.seen.batches += 1
                s.cadence.handed()
                return batch
        batch = next(self.real)
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


class Session:
    """One diagnosis of a user's own loop (see the module's docstring). Open it with
    `with Session(...)` (or `watching()`), run the loop; `report` once the verdict is in or
    the session is closed. Options as bisect()'s; `loader`: the N-th loader iterated (an
    int) or the DataLoader itself, instead of the one the loop takes optimizer steps on;
    `keep_training`: hand the loop back to the real loader after the verdict instead of
    stopping it; `on_report(report)`: called once, with the report (partial when the
    session closes before a verdict)."""

    def __init__(self, *, loader: Any = None, keep_training: bool = False, device: Any = None,
                 max_seconds: float = api.DEFAULT_MAX_SECONDS, points: Any = None, cache_mb: float = api.DEFAULT_CACHE_MB,
                 cache_batches: int = api.DEFAULT_CACHE_BATCHES, step_timeout: Optional[float] = None,
                 verify_seconds: Optional[float] = None, plan: Any = None, hold_allocator: bool = True,
                 tune: bool = False, patch: bool = False, progress: Optional[Callable[[dict], None]] = None,
                 on_report: Optional[Callable[[Report], None]] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if loader is not None and not isinstance(loader, (int, DataLoader)) and not nodes.is_graph(loader):
            raise BisectError(f"loader must be the N-th loader iterated (an int, from 1), a DataLoader or a "
                              f"torchdata.nodes Loader, got {type(loader).__name__}.")
        if isinstance(loader, int) and not isinstance(loader, bool) and loader < 1:
            raise BisectError(f"--loader counts loaders from 1 in the order your script iterates them, got {loader}.")
        self.options = Options(api.check_options(points, max_seconds=max_seconds, cache_mb=cache_mb,
                                                 cache_batches=cache_batches, step_timeout=step_timeout,
                                                 verify_seconds=verify_seconds),
                               max_seconds, cache_mb, cache_batches, step_timeout, verify_seconds, plan, hold_allocator,
                               tune, patch)
        self.device = devices.resolve(device) if device is not None else None
        self.target = loader
        self.keep_training = keep_training
        self.progress = progress
        self.on_report = on_report
        self.clock = clock
        self.seen: list = []
        self._seen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._loaders: dict = {}  # Seen.index -> weakref to its loader
        self._sites: dict = {}  # id(dataset) -> where its first loader was created
        self._site_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # loader -> where it was created
        self._born: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # loader -> when it was created (clock)
        # loader -> the stages the loop runs on its batches in its own process (the WebLoader
        # iterating it: integrations.webdataset.LoopStages), or None
        self.loop_stages: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.args: Any = None  # the script's command line as its argparse parsed it (the last parse)
        self.expected: Optional[dict] = None  # the batches the script trains on, where its epochs are known
        self.created_count = 0
        self.current: Optional[Seen] = None  # the loader whose batch the loop had last
        self.chosen: Optional[DataLoader] = None
        self.step_device: Optional[torch.device] = None
        self.state = "choosing"  # choosing | measuring | done
        self.busy = False  # the tool's own code runs: its loaders are not the user's
        self.exp: Any = None
        self.held: Optional[allocator.Held] = None
        self.visit: Any = None  # the visit under way (a pause voids its window)
        self.cadence = Cadence()
        self.epoch: Optional[LoopIterator] = None  # the epoch the experiment's batches go to
        self._candidate: Any = None  # weakref to the iterator of maybe the training loader built anew (_may_succeed)
        self.report: Optional[Report] = None
        self.error: Optional[BaseException] = None
        self.ended: Optional[tuple] = None  # (how, detail): the script ended on its own (script_ended)
        self._gen: Optional[Iterator] = None
        self._exit: Any = None
        self.pid = os.getpid()
        self._coord: Any = None
        self.argv: Optional[list] = None  # the script's command line, under `run` (the tune section's command)
        self.first_step: Optional[float] = None  # (clock) the loop's first step or batch with no loader chosen
        self.first_by = "optimizer step"
        self._said_waiting = False
        self.stepped = False  # an optimizer step was seen
        self.gave_up: Optional[str] = None  # why the loop was stopped (or let train on) with no loader: _waiting

    # -- open and close ---------------------------------------------------------------

    def __enter__(self) -> "Session":
        _SESSIONS.append(self)
        _install()
        self.pid = os.getpid()
        self._exit, os._exit = os._exit, self._os_exit
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        try:
            self.close(interrupted=isinstance(exc, KeyboardInterrupt))
        finally:
            if self in _SESSIONS:
                _SESSIONS.remove(self)
            _uninstall()
            if self._exit is not None:
                os._exit, self._exit = self._exit, None
        if isinstance(exc, ScriptStopped) and exc.error is not None:
            raise BisectError(f"bisect-pipeline failed while measuring your loop: {type(exc.error).__name__}: "
                              f"{exc.error}") from exc.error
        return isinstance(exc, ScriptStopped)

    def close(self, interrupted: bool = False) -> Optional[Report]:
        """End the experiment where it stands (its workers shut down) and make the report,
        partial when the verdict was not in. Where no training loader was chosen: a
        report of nothing measured, with the loaders seen, once the script has ended on
        its own (script_ended), else None."""
        if self.state == "measuring" and self.exp is not None:
            self.busy = True
            try:
                if self._gen is not None:
                    self._gen.close()
            finally:
                self.busy = False
            self._report(interrupted=interrupted)
        elif self.state == "choosing" and self.ended is not None and self.report is None:
            self.report, self.state = Report.of(self._nothing_measured()), "done"
            if self.on_report is not None:
                self.on_report(self.report)
        return self.report

    def script_ended(self, how: str, detail: Any = None) -> None:
        """The script ended on its own (`how`: ended, exit or raised; `detail`: the exit
        code or the exception), before the session closes: the report says so first. Not
        once the experiment is over (a script trained on with keep_training)."""
        if self.state != "done":
            self.ended = (how, detail)

    def _os_exit(self, code: int) -> None:
        """os._exit from the script: the partial report first, then the exit (in this
        process only: a forked worker's exit is its own, should the at-fork undo not have
        run)."""
        real = self._exit
        if os.getpid() != self.pid:
            real(code)
        try:
            self.close()
        finally:
            real(code)

    # -- what the patches tell it ----------------------------------------------------------

    def created(self, loader: DataLoader) -> None:
        self.created_count += 1
        where = _creation_site(loader)
        self._sites.setdefault(id(_data_of(loader)), where)  # a framework's copy keeps the creator
        self._site_of[loader] = where
        self._born[loader] = self.clock()

    def iterate(self, loader: DataLoader) -> Any:
        seen = self._seen_of(loader)
        if self.state == "done" or (self.chosen is not None and loader is not self.chosen):
            if self.state == "measuring":
                self._void()  # another loader between two of the loop's requests (an evaluation)
                self.cadence.paused()
            it = LoopIterator(self, loader, seen, real_iter(loader))  # its own batches, counted
            # the training loader built anew? its optimizer step says (optimizer_stepped); held
            # weakly: a candidate that never steps (an evaluation) goes with its iterator
            self._candidate = weakref.ref(it) if self._may_succeed(loader) else None
            return it
        if self.chosen is None and (self.target == seen.index or self.target is loader):
            self.chosen = loader
        return LoopIterator(self, loader, seen, None if loader is self.chosen else real_iter(loader))

    def _may_succeed(self, loader: DataLoader) -> bool:
        """Could `loader` be the training loader built anew for the next epoch (`for x in
        DataLoader(...)` inside the epoch loop)? While measuring, once the chosen loader's
        epoch has ended: a loader created at the same line, over a dataset of the same
        type, with the same batch size and length. It takes over only when the loop takes
        an optimizer step between two of its batches, as the first loader was chosen: an
        evaluation loader made by the same helper never does."""
        chosen, epoch = self.chosen, self.epoch
        if (self.state != "measuring" or chosen is None or epoch is None or epoch.loader is not chosen
                or not epoch.ended):
            return False
        site = self._site_of.get(loader)
        return (site is not None and site == self._site_of.get(chosen)
                and type(getattr(loader, "dataset", None)) is type(getattr(chosen, "dataset", None))
                and getattr(loader, "batch_size", None) == getattr(chosen, "batch_size", None)
                and _length(loader) == epoch.length)

    def _succeed(self, it: "LoopIterator") -> None:
        """The candidate's loader is the training loader from now on: its batches count as
        the chosen loader's (one loader in the report, `rebuilt` times), and its next
        request gets the experiment's batch (LoopIterator: chosen since its last batch)."""
        first = self._seen[self.chosen]
        first.batches += it.seen.batches
        first.rebuilt += 1
        if it.seen in self.seen:
            self.seen.remove(it.seen)
        self._seen[it.loader] = it.seen = first
        self.chosen, self._candidate = it.loader, None

    def parsed(self, namespace: Any) -> None:
        self.args = namespace

    def _expected(self) -> Optional[dict]:
        """How many batches the training loader gives the script in all: its length (an
        epoch) times the epochs the script's command line asks for (epochs_asked); None
        where either is not known."""
        length = _length(self.chosen) if self.chosen is not None else None
        epochs = epochs_asked(self.args)
        if not length or not epochs:
            return None
        return {"epoch_batches": length, "epochs": epochs, "batches": length * epochs}

    def _batches_left(self) -> Optional[int]:
        """The batches the script has yet to take from its training loader (Experiment.
        batches_left), where its length is known."""
        seen = self._seen.get(self.chosen) if self.chosen is not None else None
        if self.expected is None or seen is None:
            return None
        return max(0, self.expected["batches"] - seen.batches)

    def observed(self, seen: Seen) -> None:
        self.current = seen
        seen.with_grad = torch.is_grad_enabled()
        if self.chosen is None and self.state == "choosing":
            self._waiting(sys._getframe(1), seen)

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        self.stepped = True
        if self.step_device is None:
            self.step_device = _param_device(optimizer)
        cand = self._candidate() if self._candidate is not None else None
        if cand is not None and self.state == "measuring" and self.current is cand.seen and cand.seen.with_grad:
            self._succeed(cand)
        if self.chosen is None and self.target is None and self.current is not None and self.current.with_grad:
            ref = self._loaders.get(self.current.index)
            self.chosen = ref() if ref is not None else None
        if self.chosen is None and self.state == "choosing":
            self._waiting(sys._getframe(1))

    # -- never silent: a loop that iterates nothing the tool can cache ------------------

    def _waiting(self, frame: Any, seen: Optional[Seen] = None) -> None:
        """The loop runs (it takes optimizer steps, or batches of a loader: `seen`) and no
        training loader is chosen: said once, after SAY_WAITING_SHARE of --max-seconds
        (what the loop iterates, and how long the tool waits); once the loop has run for
        --max-seconds, the script is stopped with the one paragraph that says why
        (`gave_up`), or, with keep_training, let train on."""
        now = self.clock()
        if self.first_step is None:
            self.first_step, self.first_by = now, "optimizer step" if seen is None else "batch"
        waited = now - self.first_step
        if not self._said_waiting and waited >= SAY_WAITING_SHARE * self.options.max_seconds:
            self._said_waiting = True
            target = self._loop_target(frame, seen)
            if target is None:
                over = "your script takes optimizer steps outside any `for` loop the tool could read"
            elif seen is not None and not self.stepped:
                over = f"your loop ({target.where}) takes batches of {target.what} but no optimizer step"
            else:
                over = f"your loop ({target.where}) takes optimizer steps over {target.what}"
            self._say(f"waiting for a training loader the tool can cache: {over}; it waits "
                      f"{self.options.max_seconds:g} s (--max-seconds) for one")
        if waited >= self.options.max_seconds:
            self.gave_up = self._never_silent(self._loop_target(frame, seen), waited)
            if self.keep_training:  # said now (and again when the script ends); stopped, it is said once then
                self._say(self.gave_up)
                self.state = "done"  # its loaders yield their own batches from now on
                return
            self.ended = ("stopped", None)
            self._stop_graphs()
            raise ScriptStopped()

    def _loop_target(self, frame: Any, seen: Optional[Seen] = None) -> Optional[loop_target.Target]:
        """What the loop iterates (loop_target.find); where it takes batches of a loader it
        does not iterate in that `for` (`seen`), that loader at the loop's line."""
        skipped = _skipped_dirs()

        def user_code(f: Any) -> bool:
            name = f.f_code.co_filename
            return not name.startswith("<") and not os.path.abspath(name).startswith(skipped)

        def site_of(obj: Any) -> Optional[str]:
            try:
                return self._site_of.get(obj)
            except TypeError:  # not weakly referable: no loader of ours
                return None
        try:
            target = loop_target.find(frame, user_code, site_of)
            ref = self._loaders.get(seen.index) if seen is not None else None
            loader = ref() if ref is not None else None
            if loader is not None and (target is None or target.obj is not loader):
                return loop_target.at(frame, loader, user_code, site_of, seen.index)
            if target is not None and seen is not None and target.obj is loader:
                what, why = loop_target.describe(loader, None, site_of, seen.index)
                return dataclasses.replace(target, what=what, why=why)
            return target
        except Exception:  # reading the frames is best effort: the message says less
            return None

    def _never_silent(self, target: Optional[loop_target.Target], waited: float) -> str:
        """The one paragraph said when the loop ran for --max-seconds without a training
        loader the tool can cache."""
        takes = "iterates" if target is None or target.line.startswith("for ") else "takes batches of"
        loop = (f"your loop ({target.where}: `{target.line}`) {takes} {target.what}, {target.why}."
                if target is not None else
                "its optimizer steps are not taken inside a `for` loop the tool could read.")
        seen = "; ".join(f"#{x.index} {x.dataset} ({x.batches} batches, created at {x.created_at or '?'})"
                         for x in self.seen)
        return (f"no training loader after {waited:.0f} s of your loop (--max-seconds {self.options.max_seconds:g}, "
                f"from its first {self.first_by}): {loop}"
                + (f" Loaders it iterated: {seen}." if seen else "")
                + (" It trains on (--keep-training)." if self.keep_training else
                   " The script is stopped (--keep-training lets it train on)."))

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress({"event": "waiting", "message": message})

    def epoch_ended(self) -> None:
        self._void()

    def _room(self) -> Optional[int]:
        """Batches the loop takes before its next pause known ahead, the one being handed
        out included: the rest of its epoch, or fewer where it evaluates every K batches
        (Cadence); None where neither is known."""
        e = self.epoch
        rooms = [self.cadence.room(), None if e is None or e.length is None else max(1, e.length - e.served)]
        return min((r for r in rooms if r is not None), default=None)

    def _void(self) -> None:
        void = getattr(self.visit, "void", None)
        if void is not None:
            void()

    def _seen_of(self, loader: DataLoader) -> Seen:
        seen = self._seen.get(loader)
        if seen is None:
            seen = Seen(len(self.seen) + 1, *_described(loader), self._sites.get(id(_data_of(loader))))
            self._seen[loader] = seen
            self._loaders[seen.index] = weakref.ref(loader)
            self.seen.append(seen)
        return seen

    # -- the experiment, driven by the loop -----------------------------------------------

    def next_batch(self) -> Any:
        """The experiment's next batch for the loop. Once the experiment is over: the
        report, then ScriptStopped (or _Passthrough with keep_training)."""
        if self._gen is None:
            self._gen = self._stream()
        self.busy = True
        try:
            return next(self._gen)
        except StopIteration:
            pass
        except (KeyboardInterrupt, ScriptStopped):
            raise
        except Exception as exc:  # the tool's own failure, not the loop's: said, and the loop stopped
            self.error = exc
        finally:
            self.busy = False
        if self.report is None:
            self._report(interrupted=False)
        if self.keep_training and self.error is None:
            raise _Passthrough()
        self._stop_graphs()
        raise ScriptStopped(self.report, self.error)

    def _stop_graphs(self) -> None:
        """Before the tool stops the script: the threads of the node graphs it iterated
        (its own iterators, left running in its loop) are stopped, or the interpreter's
        exit aborts in them (a thread inside torch at exit: 'terminate called without an
        active exception')."""
        for ref in self._loaders.values():
            loader = ref()
            if loader is not None and nodes.is_graph(loader):
                graph.shutdown(loader)

    def _stream(self) -> Iterator:
        """Every phase's visits (phases.measure), their batches handed to the loop."""
        spec = api.describe(self.chosen)
        dev = self.device or self.step_device or devices.resolve(None)
        coord = self._coord = distributed.Coordinator.current()
        if coord is not None:
            coord.joinables = _joinables()
        # --max-seconds counts from the creation of the training loader (what the script did
        # before it is its start-up, reported): the script's first batches on it included
        exp = self.exp = api.start(spec, dev, self.options, coord=coord, clock=self.clock, progress=self.progress,
                                   loop=True, started=self._born.get(self.chosen))
        exp.move = lambda batch: to_device(batch, dev)  # where the device point's batches are put
        exp.loop_stages = self.loop_stages.get(self.chosen)  # run by the loop itself, timed alone
        exp.room = self._room
        self.expected = self._expected() if coord is None else None
        exp.batches_left = self._batches_left
        self.held = allocator.Held(self.options.hold_allocator)
        self.state = "measuring"
        try:
            for visit in phases.measure(exp, self.options, coord=coord, held=self.held):
                self.visit = visit
                with visit as batches:
                    yield from batches
                self.visit = None
        finally:
            self.visit = None
            self.held.release()
            if exp.isolated is None:
                exp.isolated, exp.syncs = phases.not_isolated("your script ended" if self.ended else "interrupted")

    def _report(self, interrupted: bool) -> None:
        early = self.ended is not None and not interrupted  # the script ended before the experiment did
        m = self.exp.measurements(self.options.points, held=self.held.record(), interrupted=interrupted, mode="loop",
                                  source=self.source(self._shortfall() if early else None),
                                  unreached="your script ended first" if early else None)
        if m.tune is not None:  # --tune: the best settings written against the script (change.py)
            m = change.patched(m, self.argv)
        report = Report.of(m)
        coord = self._coord
        if coord is not None and not interrupted:
            report = combine(report, distributed.gather_reports(report, coord, self.exp.waits), coord.rank)
        self.report, self.state = report, "done"
        if self.on_report is not None:
            self.on_report(report)

    def source(self, ended: Optional[dict] = None) -> dict:
        """Which loader the loop trained on, and every loader seen (the report's `source`);
        `ended`: how the script ended before the experiment did (_shortfall)."""
        seen = self._seen.get(self.chosen) if self.chosen is not None else None
        out = seen.to_dict() if seen is not None else {}
        out.update(chosen_by="--loader" if self.target is not None else "the loader your optimizer steps on",
                   loaders=[x.to_dict() for x in self.seen])
        if self.expected is not None:
            out["expected"] = dict(self.expected)
        if ended is not None:
            out["ended"] = ended
        return out

    def _shortfall(self) -> dict:
        """How the script ended, the batches its training loader gave, and the fewest the
        measurement needs: plan.min_rounds visits of each point measured
        (Plan.least_visit_steps at the step measured so far, or at the shortest window
        where none was), and the fewest batches one epoch must have for a window."""
        how, detail = self.ended
        exp = self.exp
        seen = self._seen.get(self.chosen) if self.chosen is not None else None
        names = [n for n in self.options.points if exp.not_applicable(n) is None]
        est = exp.step_estimate()
        needed, per_epoch = 0, 0
        for name in names:
            plan, prefetch = exp.visit_plan(name)
            needed += plan.least_visit_steps(est or plan.window_seconds, prefetch)
            per_epoch = max(per_epoch, plan.least_epoch_steps(prefetch))
        detail_text = (f"sys.exit({detail!r})" if how == "exit" else
                       f"{type(detail).__name__}: {detail}"[:200] if how == "raised" else None)
        return {"how": how, "detail": detail_text, "batches": seen.batches if seen else 0,
                "needed": needed * exp.plan.min_rounds, "rounds": exp.plan.min_rounds, "points": len(names),
                "epoch_batches": _length(self.chosen), "epoch_needs": per_epoch}

    def _nothing_measured(self) -> Any:
        """The measurements of a run whose script ended before a training loader was
        chosen: every point not run, and the loaders seen (the partial --json)."""
        why = self.gave_up or f"no training loader was found: {self.summary_of_what_was_seen()}"
        dev = self.device or self.step_device or devices.resolve(None)
        return Measurements(device=str(dev), batch_size=1, points=tuple(
            PointResult(name, "not run", reason=why) for name in POINTS), complete=False, mode="loop",
            source=dict(self.source(), ended={"how": self.ended[0], "batches": 0, "no_loader": why}))

    def summary_of_what_was_seen(self) -> str:
        """What the session saw, for a run that ended without a report."""
        if not self.seen:
            return (f"your script iterated no DataLoader ({self.created_count} created): there is no training loop "
                    "to measure")
        listed = "; ".join(f"#{s.index} {s.dataset} ({s.batches} batches{', grad' if s.with_grad else ''}, created "
                           f"at {s.created_at or '?'})" for s in self.seen)
        return (f"no training loader was found among the {len(self.seen)} loader(s) your script iterated ({listed}): "
                "none had an optimizer step taken between two of its batches. Name it with --loader N")


def watching(**options: Any) -> Session:
    """`with bisect_pipeline.watching() as session: train(...)`, then `session.report`:
    your own training loop is the step (see loop.py). Options: bisect()'s, and `loader`,
    `keep_training`. Once the verdict is in, the loop is stopped (the with block ends
    there) unless keep_training."""
    return Session(**options)


class Watched:
    """`loader = bisect_pipeline.watch(loader)` for a loop you write yourself: iterate it
    as the loader; `report` once the verdict is in, after which it yields the loader's own
    batches again (the experiment ran on len(loader) batches per epoch meanwhile)."""

    def __init__(self, loader: Any, **options: Any) -> None:
        if not isinstance(loader, DataLoader) and not nodes.is_graph(loader):
            raise BisectError(f"watch() takes a torch.utils.data.DataLoader or a torchdata.nodes Loader, got "
                              f"{type(loader).__name__}.")
        self.loader = loader
        self.session = Session(loader=loader, keep_training=options.pop("keep_training", True), **options)
        self._open = False

    @property
    def report(self) -> Optional[Report]:
        return self.session.report

    def __len__(self) -> int:
        n = _length(self.loader)
        if n is None:
            raise TypeError(f"this {type(self.loader).__name__} has no length")
        return n

    def __iter__(self) -> Any:
        if self.session.state == "done":
            self.close()
            return real_iter(self.loader)
        if not self._open:
            self.session.__enter__()
            self._open = True
        return self.session.iterate(self.loader)

    def close(self) -> Optional[Report]:
        """End the experiment where it stands; the report (partial before a verdict)."""
        if self._open:
            self._open = False
            self.session.__exit__(None, None, None)
        return self.session.report


def watch(loader: DataLoader, **options: Any) -> Watched:
    return Watched(loader, **options)
