"""Your own training loop as the step: `bisect-pipeline run train.py`, `watching()`,
`watch(loader)`.

The experiment is the one `--entry` runs (phases.measure: the same caches, replays,
visits, rounds, verdict, advice and report); only the driver differs. Here the user's
loop drives: the training loader's iterator hands the loop the batches of each visit in
turn (loop_loaders.py), and the time between two of its requests is its step, whatever
it does around the model (logging, metric syncs, accumulation, AMP, EMA, a scheduler).

While a Session is open, the patches (loop_patches.py) tell it what the script does.
The training loader is the first loader iterated with grad enabled whose consumer takes
an optimizer step between two of its batches (an evaluation loader, under no_grad or
inference_mode, is never chosen); `loader=N` picks the N-th loader iterated instead.
Until then every loader yields its own batches; once chosen, its iterator's workers are
shut down and the experiment starts inside the loop's next request.

Epochs: the experiment goes on in the next epoch's iterator, or in a loader built anew
for the next epoch at the same line (Session._may_succeed: it takes over at the loop's
first optimizer step on it, as the first one was chosen). An epoch's end, another loader
iterated, or a pause far beyond a step voids the window under way (visit.Visit):
discarded and counted. The pauses are the run's time all the same: --max-seconds bounds
the run's wall time, the loop's evaluations included (a script whose evaluations fill
the budget is told so, with the seconds they took). The session's end: loop_end.py.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import weakref
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader

from . import api, loop_patches, loop_target, phases
from .core.errors import AnalysisFailed, BisectError
from .loop_end import Ending, ScriptStopped
from .loop_loaders import Cadence, LoopIterator, Passthrough, Seen, data_of, described, epoch_length
from .measure import allocator, devices, distributed
from .phases import Options
from .pipeline.integrations import nodes
from .pipeline.step import to_device
from .report import Report

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


def _param_device(optimizer: torch.optim.Optimizer) -> Optional[torch.device]:
    return next((p.device for group in optimizer.param_groups for p in group["params"]), None)


def _joinables() -> list:
    """The DDP modules (and other Joinables) of this process: a lockstep unit runs under
    Join over them (distributed.Coordinator), which the user's loop cannot hand over."""
    from torch.distributed.algorithms.join import Joinable

    return [o for o in gc.get_objects() if isinstance(o, Joinable)]


class Session(Ending):
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
        self.stopped: Optional[BaseException] = None  # under torchrun: the lockstep stopped (distributed.Stopped)
        self.argv: Optional[list] = None  # the script's command line, under `run` (the tune section's command)
        self.first_step: Optional[float] = None  # (clock) the loop's first step or batch with no loader chosen
        self.first_by = "optimizer step"
        self._said_waiting = False
        self.stepped = False  # an optimizer step was seen
        self.gave_up: Optional[str] = None  # why the loop was stopped (or let train on) with no loader: _waiting

    def __enter__(self) -> "Session":
        loop_patches.SESSIONS.append(self)
        loop_patches.install()
        self.pid = os.getpid()
        self._exit, os._exit = os._exit, self._os_exit
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        try:
            self.close(interrupted=isinstance(exc, KeyboardInterrupt))
        finally:
            if self._coord is not None:
                self._coord.release()
            if self in loop_patches.SESSIONS:
                loop_patches.SESSIONS.remove(self)
            loop_patches.uninstall()
            if self._exit is not None:
                os._exit, self._exit = self._exit, None
        if isinstance(exc, ScriptStopped) and isinstance(exc.error, AnalysisFailed):
            raise exc.error  # with the measurements, for the command line to write (cli._saved)
        if isinstance(exc, ScriptStopped) and exc.error is not None:
            raise BisectError(f"bisect-pipeline failed while measuring your loop: {type(exc.error).__name__}: "
                              f"{exc.error}") from exc.error
        return isinstance(exc, ScriptStopped)

    # -- what the patches tell it ----------------------------------------------------------

    def created(self, loader: DataLoader) -> None:
        self.created_count += 1
        where = loop_target.creation_site(loader)
        self._sites.setdefault(id(data_of(loader)), where)  # a framework's copy keeps the creator
        self._site_of[loader] = where
        self._born[loader] = self.clock()

    def iterate(self, loader: DataLoader) -> Any:
        seen = self._seen_of(loader)
        if self.state == "done" or (self.chosen is not None and loader is not self.chosen):
            if self.state == "measuring":
                self._void()  # another loader between two of the loop's requests (an evaluation)
                self.cadence.paused()
            it = LoopIterator(self, loader, seen, loop_patches.real_iter(loader))  # its own batches, counted
            # the training loader built anew? its optimizer step says (optimizer_stepped); held
            # weakly: a candidate that never steps (an evaluation) goes with its iterator
            self._candidate = weakref.ref(it) if self._may_succeed(loader) else None
            return it
        if self.chosen is None and (self.target == seen.index or self.target is loader):
            self.chosen = loader
        return LoopIterator(self, loader, seen, None if loader is self.chosen else loop_patches.real_iter(loader))

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
                and epoch_length(loader) == epoch.length)

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
        length = epoch_length(self.chosen) if self.chosen is not None else None
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
            seen = Seen(len(self.seen) + 1, *described(loader), self._sites.get(id(data_of(loader))))
            self._seen[loader] = seen
            self._loaders[seen.index] = weakref.ref(loader)
            self.seen.append(seen)
        return seen

    # -- the experiment, driven by the loop -----------------------------------------------

    def next_batch(self) -> Any:
        """The experiment's next batch for the loop. Once the experiment is over: the
        report, then ScriptStopped (or Passthrough with keep_training)."""
        if self._gen is None:
            self._gen = self._stream()
        self.busy = True
        try:
            return next(self._gen)
        except StopIteration:
            pass
        except distributed.Stopped as stop:  # a signal, or a rank lost: every rank's result gathered, the loop stopped
            self.stopped = stop
        except (KeyboardInterrupt, ScriptStopped):
            raise
        except Exception as exc:  # the tool's own failure, not the loop's: said, and the loop stopped
            self.error = exc
        finally:
            self.busy = False
        if self.report is None:
            try:
                self._report(interrupted=self.stopped is not None)
            except AnalysisFailed as exc:  # a bug deriving the report: the script stopped, the measurements kept
                self.error = exc
        if self.keep_training and self.error is None and self.stopped is None:
            raise Passthrough()
        self._stop_graphs()
        raise ScriptStopped(self.report, self.error)

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
        api.rescue_with(exp, coord, lambda: self._measured(interrupted=True))
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
        n = epoch_length(self.loader)
        if n is None:
            raise TypeError(f"this {type(self.loader).__name__} has no length")
        return n

    def __iter__(self) -> Any:
        if self.session.state == "done":
            self.close()
            return loop_patches.real_iter(self.loader)
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
