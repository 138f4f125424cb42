"""Every phase of one experiment, as the visits a driver drives.

    fill the caches (cache.fill)
    probe the step: does it change its batch in place?
    hold the allocator still (timing the step alone first, when the tool owns the step)
    the stage costs timed alone (isolate.py): the verdict's second witness
    the points: rounds.Rounds (one process) or distributed.LockstepPoints (torchrun)
    a user's loop on CUDA: its syncs counted
    the check: the costliest transform in the pipeline (confirm.Confirm, when augment is
        the bottleneck); turns.Trials of the advice as it stands (diagnosis.to_check)

`measure` yields visits: visit.Visit, and in a user's loop two small ones of the same
shape (a context manager handing out batches: the probe and the sync count). The tool's
own driver steps them (visit.drive_all, api.bisect); a user's loop consumes their
batches (loop.py). Each phase keeps what it measured in the Experiment, whose
`measurements` is then diagnosed: one engine, two drivers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from typing import Any, Iterator, Optional

import torch

from .advise import confirm, fixes, tune
from .advise.diagnose import judged, to_check
from .advise.turns import Trials
from .core import stats, tree
from .core.results import AllocatorTiming, Isolated, Syncs, Verification
from .derive.verdict import in_question
from .measure import allocator, device_alone, distributed, isolate, prepare, sources
from .measure.cache import DEFAULT_CACHE_BATCHES
from .measure.experiment import Experiment
from .measure.plan import DEFAULT_CACHE_MB, DEFAULT_MAX_SECONDS, EPOCH_WINDOW_S, Plan
from .measure.rounds import Rounds


@dataclasses.dataclass(frozen=True)
class Options:
    """How one experiment runs (README "Command line"; checked by api.check_options)."""

    points: tuple
    max_seconds: float = DEFAULT_MAX_SECONDS
    cache_mb: float = DEFAULT_CACHE_MB
    cache_batches: int = DEFAULT_CACHE_BATCHES
    step_timeout: Optional[float] = None
    verify_seconds: Optional[float] = None
    plan: Optional[Plan] = None
    hold_allocator: bool = True
    tune: bool = False  # --tune: the search of tune.py after the check
    patch: bool = False  # --patch (under `run`, with tune): the change checked after the run, in its budget


def measure(exp: Experiment, options: Options, *, coord: Any, held: allocator.Held,
            batch_size: Any = None) -> Iterator[Any]:
    """The phases of one experiment (see the module's docstring), yielding the visits to
    drive. Under torchrun only the points run (in lockstep); their waits for data are
    kept in `exp.waits`."""
    prepare.fill(exp, options.points, cache_mb=options.cache_mb, cache_batches=options.cache_batches,
                 max_seconds=options.max_seconds, batch_size=batch_size)
    if exp.loop:
        if exp.caches is not None:
            yield Probe(exp)
        held.hold()
        exp.allocator_timing = AllocatorTiming.missing("skipped", "the step is your own loop: it is not timed alone")
    else:
        prepare.probe_step(exp, coord)
        exp.allocator_timing = prepare.hold_allocator(exp, held, coord, options.max_seconds)
    if coord is not None:
        schedule = distributed.LockstepPoints(exp, coord, options.points)
        yield from schedule
        exp.waits = schedule.waits
        return
    # the stages alone witness the verdict of every round; with `full` alone there is no
    # drop to witness (the change's check runs the script so, briefly): after the points
    witnessed = any(p != "full" for p in options.points)
    if witnessed:
        exp.isolated, exp.syncs = isolate.before_points(exp, max_seconds=options.max_seconds)
    if exp.spec.num_workers and exp.spec.batches_per_epoch and not exp.loop:  # the rounds leave epoch_start its time
        exp.deadline = min(exp.deadline, exp.end - min(EPOCH_VISIT_S, EPOCH_SHARE * options.max_seconds))
        exp.settle_deadline = min(exp.settle_deadline, exp.deadline)
    rounds = Rounds(exp, options.points)
    yield from rounds
    exp.schedule = rounds.info
    exp.epoch_start = yield from epoch_start(exp)
    if witnessed:
        exp.isolated = isolate.with_ceiling(exp.isolated, exp.results)
    else:
        exp.isolated, exp.syncs = isolate.before_points(exp, max_seconds=options.max_seconds)
    if exp.loop and exp.caches is not None:
        counted = SyncCount(exp)
        yield counted
        exp.syncs = counted.syncs
    yield from advise(exp, exp.measurements(options.points, held=held.record(), interrupted=False), options)


def advise(exp: Experiment, draft: Any, options: Options):
    """The phases after the bisection, on its measurements (`draft`): the advice's check
    (_verify), then --tune's search (_tune), each noted in the budget's `spent`."""
    t = _spent(exp, "bisecting", exp.start)
    try:
        exp.verification = yield from _verify(exp, draft, options.verify_seconds, tuning=options.tune)
        t = _spent(exp, "checking", t)
        if options.tune:
            exp.tuning = yield from _tune(exp, draft, options.verify_seconds)
            _spent(exp, "searching", t)
    finally:
        exp.close_kept()  # the pool of the user's side, kept from trial to trial (verify._visit)


def _spent(exp: Experiment, part: str, since: float) -> float:
    """Note the time `part` took, from `since` to now (the budget's `spent`: where the time
    went, beside how it was divided); returns now."""
    now = exp.clock()
    if exp.budget is not None:
        exp.budget = exp.budget.spending(part, now - since)
    return now


def _verify(exp: Experiment, draft: Any, verify_seconds: Optional[float], tuning: bool = False):
    """The check of the advice as it stands on the bisection's measurements (`draft`):
    when augment is in question (named, or tied for the lead: verdict.in_question), its
    costliest transform measured in the pipeline first (confirm.Confirm, CONFIRM_SHARE of
    the budget); then, where a stage is in question, the pipeline's own fixes built and
    checked against the user's batches (_fixes: the advice then speaks of them); then the
    advice's recommended settings and usable fixes measured against the user's
    (turns.Trials) in the rest.
    verify_seconds None: in what the bisection leaves of max_seconds (the rounds that
    only settle a verdict already made stop VERIFY_SHARE of it early; an undecided
    verdict may use it all); 0: off; a number: a budget of its own, on top of max_seconds.
    `tuning`: the search (tune.Search) comes after and gets what the check leaves of
    the budget: the check takes tune.CHECK_SHARE of it at most."""
    questioned = in_question(exp.decide())
    if verify_seconds == 0:
        exp.isolated = confirm.skipped(exp.isolated, questioned, "the check is off (verify_seconds=0)")
        return Verification(status="off", reason="verification turned off (verify_seconds=0)")
    start = exp.clock()
    budget = max(0.0, exp.end - start) if verify_seconds is None else float(verify_seconds)
    in_batches = batch_seconds(exp)
    if min(budget, in_batches) < 2 * exp.plan.window_seconds:
        short = in_batches < budget
        why = ("your script's batches: the bisection used what it has left" if short else
               "the bisection used --max-seconds")
        exp.isolated = confirm.skipped(exp.isolated, questioned, f"out of time: {why}")
        return Verification(status="out of time", budget_s=round(min(budget, in_batches), 3),
                            reason=why + ("; run your script for more epochs" if short else
                                          "; give the check a budget of its own with --verify-seconds"))
    budget = min(budget, in_batches)
    if "augment" in questioned and exp.caches is not None and exp.caches.raw_calls is not None:
        confirming = confirm.Confirm(exp, budget_s=confirm.CONFIRM_SHARE * budget)
        yield from confirming
        exp.isolated = confirm.with_confirmation(exp.isolated, confirming.result)
        budget = max(0.0, budget - (exp.clock() - start))
    mark = exp.clock()
    built = _fixes(exp, questioned)
    budget = max(0.0, budget - (exp.clock() - mark))
    advice = to_check(dataclasses.replace(draft, verification=Verification(status="not run", fixes=built)))
    if tuning:
        budget *= tune.CHECK_SHARE
    trials = Trials(exp, list(advice), budget_s=budget, threads=torch.get_num_threads(), cores=isolate.cores())
    yield from trials
    return dataclasses.replace(trials.result, fixes=built or None)


def _fixes(exp: Experiment, questioned: tuple) -> tuple:
    """The pipeline's own fixes, built and checked (fixes.build), where a stage is in
    question; their usable Variants kept for the trials (exp.variants). On CUDA the
    syncs each tail adds are counted on a cached device batch, as the step's are."""
    if not questioned:
        return ()
    count = None if exp.device.type != "cuda" else (lambda fn, batch: device_alone.count_syncs(fn, batch, exp.device))
    built, exp.variants = fixes.build(exp, count)
    return built


def _tune(exp: Experiment, draft: Any, verify_seconds: Optional[float]):
    """The search of --tune (tune.Search) in what the check left of its budget (the
    budget of its own with verify_seconds, less what the check took), seeded with the
    check's trials. Under torchrun, or with the check off, not run (the ranks would have
    to agree on every candidate; 0 turns measuring settings off)."""
    space = tune.space_of(judged(draft), cores=isolate.cores(), threads=torch.get_num_threads())
    if verify_seconds == 0:
        space = dataclasses.replace(space, workers=(), reason="the check is off (verify_seconds=0)")
    checked = exp.verification
    spent = (checked.elapsed_s or 0.0) if checked is not None else 0.0
    budget = (max(0.0, exp.end - exp.clock()) if verify_seconds is None else max(0.0, float(verify_seconds) - spent))
    budget = min(budget, batch_seconds(exp, paired=True))
    # while it has no change to check, the search may run into the change's check's share
    # but for the least that check needs (plan.Budget.patch_least)
    b = exp.budget
    reach = (exp.start + b.max_seconds - b.patch_least - exp.clock()
             if b is not None and b.patching and verify_seconds is None else 0.0)
    search = tune.Search(exp, space, budget_s=budget, seeds=tuple(checked.trials) if checked is not None else (),
                         reach_s=min(reach, batch_seconds(exp, paired=True)))
    yield from search
    return search.result


# Batches of a counted script (Experiment.batches_left) left unused at the end of the
# phases, so that the experiment ends, and its report is made, before the script does.
BATCH_MARGIN = 8


def batch_seconds(exp: Experiment, paired: bool = False) -> float:
    """The time the batches the user's script has left last at the fastest a setting may
    consume them (the fastest point measured: no setting of the loader beats the step
    alone), less BATCH_MARGIN of them; infinite where the script's length is not known.
    `paired`: consumed by trials (verify.alternate), half of whose time goes to visits of
    the user's own settings at the full point's rate: at the harmonic mean of the two
    rates."""
    left = exp.batches_left()
    sec = exp.step_estimate()
    if left is None or sec is None:
        return float("inf")
    full = exp.results.get("full")
    if paired and full is not None and full.ok:
        sec = 2.0 / (1.0 / sec + 1.0 / full.throughput.sec_per_batch)
    return max(0.0, (left - BATCH_MARGIN) * sec)


# The pause at each epoch's start is timed in whole epochs where an epoch of the full
# pipeline lasts at most plan.EPOCH_WINDOW_S, in a visit of at most EPOCH_VISITS_S.
EPOCH_VISIT_S = 8.0
EPOCH_SHARE = 0.1  # of --max-seconds, kept from the rounds for it where it may be timed


def epoch_start(exp: Experiment):
    """The pause at the start of each epoch of the user's loader (its workers started
    again unless persistent, its prefetch refilled, the last epoch's shut down: none of
    which any point's window holds, their loaders never ending an epoch), per epoch and
    per batch, as RunInfo.epoch_start. Where the user's loader has workers and short
    epochs (plan.EPOCH_WINDOW_S), timed: one visit of `full` ending its epochs as the
    user's loop does (Experiment.visit, epochs: windows of whole epochs), against the full
    point's own time; elsewhere (a user's loop, whose own epoch ends void the windows, or
    long epochs, where the pause weighs less) estimated from the full point's first batch
    (its workers' start) less one step. None without workers, a length or a full point."""
    full = exp.results.get("full")
    n = exp.spec.batches_per_epoch
    if not exp.spec.num_workers or not n or full is None or not full.ok:
        return None
    sec = full.throughput.sec_per_batch
    out = {"epoch_batches": n, "persistent_workers": bool(exp.spec.persistent_workers)}
    timed = None
    left = exp.end - exp.clock()  # (before the check, from its time: the pause weighs on every figure)
    if not exp.loop and n * sec <= EPOCH_WINDOW_S and left > 4 * n * sec:
        span = min(EPOCH_VISIT_S, left / 2, 6 * n * sec + 2.0)
        plan = epoch_plan(exp.visit_plan("full", epochs=True)[0], n)
        # as many windows as the span holds at the epoch the full point's first batch
        # suggests, each kept; they end the visit, not its deadline (2 spans), whose cut
        # drops the window under way: the slower one (a slow epoch's start in it)
        epoch = n * sec + max(0.0, (full.first_batch_seconds or sec) - sec)
        windows = max(2, int(span / (math.ceil(plan.min_window_steps / n) * epoch)))
        visit = exp.visit("full", exp.clock() + min(left, 2 * span), epochs=True, keep=windows)
        visit.plan = plan
        yield visit
        m = visit.measured
        if m is not None and m.error is None and m.windows:
            timed = sum(w.seconds for w in m.windows) / sum(w.steps for w in m.windows)
            epochs = [w.seconds / w.steps * n for w in m.windows]
            out["epochs_timed"] = sum(w.steps for w in m.windows) // n
            if len(epochs) > 1:
                out["ms_per_epoch_se"] = round(stats.mean_se(epochs) * 1e3, 3)
    if timed is not None:
        pause, out["how"] = max(0.0, (timed - sec) * n), "timed in whole epochs"
    elif full.first_batch_seconds:
        pause, out["how"] = max(0.0, full.first_batch_seconds - sec), "its first batch less a step (estimated)"
    else:
        return None
    bs = exp.batch_size
    out.update(ms_per_epoch=round(pause * 1e3, 3), ms_per_batch=round(pause / n * 1e3, 3),
               samples_per_sec=round(bs / sec, 3), samples_per_sec_with_epochs=round(bs / (sec + pause / n), 3))
    return out


def epoch_plan(plan: Plan, batches_per_epoch: int) -> Plan:
    """The plan of the visit that times the pause at each epoch's start: windows of whole
    epochs (Plan.for_epochs), persistent workers or not, as few as a window may hold
    (one, or what min_window_steps asks), each kept. The steady pair (plan.visit_state)
    keeps the windows from the first two that agree: there a slow epoch (a fork
    descheduled, the machine busy a moment) is the pause's own cost, which a loop over the
    same epochs pays, and dropping the windows before the pair read the pause low
    (docs/benchmarks.md, issue 44)."""
    return dataclasses.replace(plan.for_epochs(batches_per_epoch), max_warmup_windows=0,
                               max_window_steps=batches_per_epoch)


def not_isolated(why: str = "interrupted") -> tuple[Isolated, Syncs]:
    """Why the stages were not timed alone: torchrun, or the run ended first (`why`: an
    interrupt, the user's script ending)."""
    reason = ("not timed under torch.distributed: isolated steps would break the ranks' lockstep"
              if distributed.env_world_size() > 1 else f"{why} before the isolated timings")
    return Isolated.missing("skipped", reason), Syncs.missing("skipped", reason)


# --------------------------------------------------------------------------------------
# The small visits of a user's loop
# --------------------------------------------------------------------------------------


class Probe:
    """Does the loop change its batch in place? It gets a copy of a cached device batch;
    at its next request the copy is compared with the original (the Experiment's `fresh`:
    the cached points then hand out copies). It also makes the loop's first calls on the
    tool's batches before anything is timed."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.measured = None

    def __enter__(self) -> Iterator:
        return self._batches()

    def __exit__(self, *exc: Any) -> None:
        return None

    def _batches(self) -> Iterator:
        original = prepare.one_device_batch(self.exp)
        handed = tree.clone(original)
        yield handed
        self.exp.sync()
        self.exp.fresh = not tree.same_values(handed, original)
        if self.exp.fresh:
            self.exp.notes.append(prepare.fresh_copy_note("Your loop"))


class SyncCount:
    """On CUDA, the host-device synchronizations of the loop over device_alone.SYNC_STEPS
    steps on cached device batches (device_alone.SyncCounter): a loop that syncs every
    step, for a metric or a log line, pays for it at every point."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.syncs: Optional[Syncs] = device_alone.no_syncs_counted(exp.device)
        self.measured = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Iterator:
        if self.syncs is not None:  # not on CUDA: nothing to count
            return iter(())
        host = sources.host_batches(self.exp.caches, self.exp.spec, self.exp.device)
        batches = sources.device_batches(host, self.exp.move, self.exp.device)
        counter = self._stack.enter_context(device_alone.SyncCounter(self.exp.device))
        return self._batches(batches, counter)

    def _batches(self, batches: list, counter: Any) -> Iterator:
        n = 0
        for b in itertools.islice(itertools.cycle(batches), device_alone.SYNC_STEPS):
            yield tree.clone(b) if self.exp.fresh else b
            n += 1
        self.syncs = counter.syncs(n)

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
