"""How long to measure a point, and the pure rules of a visit's windows: warm-up, window
length, when to stop, which windows to keep. No clock is read here (visit.py reads it)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..core.stats import Window

# The whole run's bound by default: a clear pipeline settles in 10-15 s on 2 cores and
# stops there; one that cannot be settled (a noisy machine, two stages alike) ends here,
# inconclusive, rather than spend a minute (--max-seconds buys more rounds).
DEFAULT_MAX_SECONDS = 30.0
DEFAULT_CACHE_MB = 1024.0
# A visit whose loader ends its epochs as the user's loop does (verify.py) times windows of
# whole epochs while an epoch lasts at most this long: each window then holds exactly as
# many epoch ends as epochs, so a cost paid once per epoch (workers started again, the
# prefetch refilled) is counted at its rate. Windows of another length hold one end more
# or fewer than their share depending on where they fall, and the steady pair picks
# windows that agree: with 10-batch epochs and 8-step windows, 3 restarts in the 24 steps
# kept instead of 2.4. Longer epochs spread that cost over more than this, and their
# windows stay as they are.
EPOCH_WINDOW_S = 2.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long to measure a point.

    Points are measured in visits, scheduled in rounds (rounds.py: the ceiling down, then
    back up, and so on until the verdict is settled). A visit times windows of whole steps
    (total steps / total time), `window_seconds` long and at least `min_window_steps`
    steps each; it is warm once two consecutive windows agree within `steady_tolerance`
    (the windows before them are warm-up, at most `max_warmup_windows`), and it keeps
    `windows_per_visit` windows counting that pair. Defaults: about 1 s per visit on a
    2-core machine, so three rounds over five points take about 12 s.
    """

    window_seconds: float = 0.25
    # The steady pair is the visit: the noise of a point's time is what its visits in
    # successive rounds show (noise.Noise), and on a shared machine a visit differs from
    # the next by more than its windows do, so a shorter visit buys more rounds for the noise.
    windows_per_visit: int = 2
    min_window_steps: int = 3
    # Untimed steps before the first window (plus the batches the workers prefetched,
    # which come out at once): the step's first calls and the loader's start-up.
    min_warmup_steps: int = 2
    # Two windows within 10% of each other: the spread above which a point is flagged as
    # noisy (stats.NOISY_REL_IQR), so a warm point is one that is not visibly drifting.
    steady_tolerance: float = 0.10
    max_warmup_windows: int = 4
    # Rounds: at least three (down, up, down: a machine drifting over the run weighs on
    # every point alike, and each difference of points gets three per-round values, the
    # fewest whose spread is an estimate of its noise: noise.Noise; with two, t at one
    # degree of freedom is 78 z and no cost could be real), then more until the verdict
    # is settled; those visit only the points that can still change it, so they are
    # short. The deadline bounds them: max_rounds is a guard (a clock that does not
    # advance), set above what a budget buys (a round of `full` and the ceiling takes a
    # second or more: about 50 in 60 s), so an undecided run uses the time it was given.
    min_rounds: int = 3
    max_rounds: int = 100
    # The loader's workers (for_workers): a window spans at least one batch of each.
    workers: int = 0
    # The visit's loader ends an epoch every this many batches (0: never, or too long for
    # whole-epoch windows; see EPOCH_WINDOW_S and at_step).
    epoch_steps: int = 0
    # The most steps one visit may take, all told (0: no bound): a user's script that
    # offers only so many batches (for_steps); its windows are sized to fit it.
    max_steps: int = 0
    max_window_steps: int = 0

    def __post_init__(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError(f"Plan.window_seconds must be > 0, got {self.window_seconds}")
        if self.windows_per_visit < 1 or self.min_window_steps < 1 or self.min_warmup_steps < 0:
            raise ValueError("Plan needs windows_per_visit >= 1, min_window_steps >= 1 and min_warmup_steps >= 0")
        if not 0 < self.steady_tolerance or self.max_warmup_windows < 0:
            raise ValueError("Plan needs steady_tolerance > 0 and max_warmup_windows >= 0")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"Plan needs 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}")

    def for_workers(self, num_workers: int) -> "Plan":
        """This plan for a loader with `num_workers`: a window must span several batches
        per worker, or it times one worker's burst."""
        need = max(self.min_window_steps, 2 * num_workers)  # (a plan already for more workers keeps its windows)
        if need == self.min_window_steps and num_workers == self.workers:
            return self
        return dataclasses.replace(self, min_window_steps=need, workers=num_workers)

    def for_steps(self, max_steps: Optional[int], prefetch_depth: int = 0) -> "Plan":
        """This plan for a visit that may take at most `max_steps` steps (None: no bound):
        a script whose batches are counted (its loader's length times its epochs). Its
        windows are cut to what fits after the first batch and the warm-up (at least
        min_window_steps each), and at most one warm-up window is timed beyond the kept
        ones: a 2-ms step whose windows would hold 125 steps each for their 0.25 s gets
        windows of what its share of the script's batches holds."""
        if not max_steps:
            return self
        room = max_steps - 1 - self.min_warmup_steps - prefetch_depth
        per_window = max(self.min_window_steps, room // (self.windows_per_visit + 1))
        return dataclasses.replace(self, max_steps=int(max_steps), max_window_steps=per_window,
                                   max_warmup_windows=min(self.max_warmup_windows, 1))

    def long(self, sec_per_step: Optional[float]) -> bool:
        """Is a step of `sec_per_step` seconds a long one: a whole window or more?"""
        return sec_per_step is not None and sec_per_step >= self.window_seconds

    def for_step(self, sec_per_step: Optional[float]) -> "Plan":
        """This plan for a step of `sec_per_step` seconds (None: not known yet). Where one
        step lasts a window or more, windows of min_window_steps steps and a visit of
        2 + 3 x 3 steps would take a 2-s step 22 s a visit and a verdict minutes: a long
        step gets windows of one batch per worker (one step without workers), no warm-up
        step beyond the first batch's (untimed already; but one after a pool's start where
        the time holds it: Visit._after_start), and one window a visit: the noise comes from the rounds
        (noise.Noise), and a visit of one window buys a round of `full` and the ceiling
        in four steps, three rounds of a 2-s step in 24 s; whether a visit is steady is
        not asked of one window."""
        if not self.long(sec_per_step):
            return self
        return dataclasses.replace(self, min_window_steps=max(1, self.workers), min_warmup_steps=0,
                                   windows_per_visit=1, max_warmup_windows=0)

    def for_epochs(self, batches_per_epoch: Optional[int]) -> "Plan":
        """This plan for a visit whose loader ends an epoch every `batches_per_epoch`
        batches (None: unknown, windows as usual)."""
        return dataclasses.replace(self, epoch_steps=max(0, int(batches_per_epoch or 0)))

    def outpaced(self) -> "Plan":
        """This plan (for a long step) where the step outpaces the workers many times over
        (Experiment.input_light): each batch waits ready in the queue whichever worker made
        it, so a window of one step times the loop as one of a batch per worker does
        (for_step), in a worker count's fewer steps a visit."""
        return dataclasses.replace(self, workers=min(self.workers, 1), min_window_steps=1)

    def at_step(self, sec_per_step: float) -> "Plan":
        """This plan once a visit knows its step: fitted to a long step (for_step), and
        windows of whole epochs (at least one) when an epoch lasts at most
        EPOCH_WINDOW_S, else windows as usual."""
        plan = self.for_step(sec_per_step)
        e = plan.epoch_steps
        if not e:
            return plan
        if e * sec_per_step > EPOCH_WINDOW_S:
            return dataclasses.replace(plan, epoch_steps=0)
        return dataclasses.replace(plan, min_window_steps=math.ceil(plan.min_window_steps / e) * e)

    def whole(self, steps: int) -> bool:
        """A window of `steps` holds whole epochs, or this plan has no epochs to hold."""
        return not self.epoch_steps or steps % self.epoch_steps == 0

    def window_steps(self, sec_per_step: float) -> int:
        """Steps in a window of `window_seconds` at `sec_per_step`, at least min_window_steps,
        rounded up to whole epochs (at_step): the one window sizing rule (the first window
        from the warm-up's estimate, the next ones from the first window's rate)."""
        steps = max(self.min_window_steps, math.ceil(self.window_seconds / max(sec_per_step, 1e-9)))
        if self.max_window_steps:
            steps = max(self.min_window_steps, min(steps, self.max_window_steps))
        e = self.epoch_steps
        return math.ceil(steps / e) * e if e else steps

    def least_visit_steps(self, sec_per_step: float, prefetch_depth: int = 0, windows: Optional[int] = None) -> int:
        """The fewest steps one visit takes at `sec_per_step`: its first batch, its untimed
        warm-up (and the batches prefetched meanwhile) and the windows it keeps (or
        `windows` windows)."""
        n = self.windows_per_visit if windows is None else windows
        return 1 + self.min_warmup_steps + prefetch_depth + n * self.window_steps(sec_per_step)

    def least_visit_seconds(self, sec_per_step: float, prefetch_depth: int = 0, windows: Optional[int] = None) -> float:
        """The least time one visit takes at `sec_per_step` (least_visit_steps of it)."""
        return self.least_visit_steps(sec_per_step, prefetch_depth, windows) * sec_per_step

    def least_epoch_steps(self, prefetch_depth: int = 0) -> int:
        """The fewest batches an epoch of a user's loop must have for one window: each
        epoch's end voids the window under way, so after it the visit warms up again
        (visit.Visit) and a window must end before the epoch's last batch."""
        return self.min_warmup_steps + prefetch_depth + self.min_window_steps + 1

    def most_windows(self, keep: Optional[int] = None) -> int:
        """The most windows one visit times: the warm-up ones and those it keeps."""
        return self.max_warmup_windows + 1 + (keep or self.windows_per_visit)


def tight_order(order: list, ceiling: str, first: tuple = ()) -> list:
    """A round's visits still to make where the minimum rounds do not fit (a step of
    seconds): the ceiling, then `full` (the two bound the gap: even `none` can come of
    them, or of the stages' costs alone checked against them), then the points in `first`
    (those around the stage the costs alone put first: where a stage's drop would be
    read), then the rest in their order. The visits the time holds are made in this
    order; the rest are not opened."""
    head = [n for n in (ceiling, "full", *first) if n in order]
    head = list(dict.fromkeys(head))
    return head + [n for n in order if n not in head]


@dataclasses.dataclass(frozen=True)
class VisitState:
    """Where a visit stands after its windows so far (pure: see visit_state)."""

    start: Optional[int]  # index of the first window kept, None while still warming up
    steady: bool  # two consecutive windows agreed
    done: bool


def agree(a: Window, b: Window, tolerance: float) -> bool:
    ra, rb = a.steps_per_sec, b.steps_per_sec
    return abs(ra - rb) <= tolerance * max(ra, rb)


def visit_state(windows: list, plan: Plan, keep: Optional[int] = None) -> VisitState:
    """Warm-up ends at the first pair of consecutive windows that agree; after
    max_warmup_windows windows without one, the visit goes on from there (not steady).
    Done once `keep` windows (plan.windows_per_visit) are kept."""
    keep = keep or plan.windows_per_visit
    if plan.max_warmup_windows == 0:  # no steadiness asked for: every window counts
        return VisitState(0, True, len(windows) >= keep)
    start, steady = None, False
    for i in range(1, len(windows)):
        if i - 1 > plan.max_warmup_windows:
            break
        if agree(windows[i - 1], windows[i], plan.steady_tolerance):
            start, steady = i - 1, True
            break
    if start is None and len(windows) > plan.max_warmup_windows + 1:
        start = plan.max_warmup_windows
    return VisitState(start, steady, start is not None and len(windows) - start >= keep)


def kept_windows(windows: list, plan: Plan, keep: Optional[int] = None) -> tuple[int, bool]:
    """(index of the first window kept, steady) for a visit that ended, done or not:
    before a steady pair was seen, everything but the first window (the likeliest
    warm-up) is kept, so a visit cut short by the deadline still counts."""
    v = visit_state(windows, plan, keep)
    if v.start is not None:
        return v.start, v.steady
    return (1 if len(windows) > 1 else 0), False


@dataclasses.dataclass(frozen=True)
class Next:
    """What a visit does after a window (pure: see next_window)."""

    go_on: bool
    steps: int  # the next window's length
    out_of_time: bool


def next_window(windows: list, steps: int, plan: Plan, seconds_left: float, keep: Optional[int] = None) -> Next:
    """After each window: stop once visit_state says done; else time another window of
    `steps` steps, re-sized from the first window's rate (plan.window_steps), shortened
    to the time left; stop (out of time) when not even min_window_steps fit."""
    if len(windows) == 1:
        w = windows[0]
        steps = plan.window_steps(w.seconds / max(w.steps, 1))
    if visit_state(windows, plan, keep).done or len(windows) >= plan.most_windows(keep):
        return Next(False, steps, False)
    per_step = windows[-1].seconds / max(windows[-1].steps, 1)
    if seconds_left < plan.min_window_steps * per_step:
        return Next(False, steps, True)
    fits = max(plan.min_window_steps, min(steps, int(seconds_left / max(per_step, 1e-9))))
    if plan.epoch_steps:  # whole epochs: min_window_steps is one or more of them (at_step)
        fits = max(plan.min_window_steps, fits // plan.epoch_steps * plan.epoch_steps)
    return Next(True, fits, False)


# --------------------------------------------------------------------------------------
# The run's time, divided up front
# --------------------------------------------------------------------------------------

# --patch: the change is checked by running the patched script (change.check), in
# PATCH_RUNS run of its own: the search has measured the setting in this process already,
# so the run confirms what only it can (the script builds its loader with the change, and
# its speed agrees with the search's figure). It pays the script's start-up (what this
# run's start-up measured) before its loop, then PATCH_RUN_MARGIN_S for its report and its
# workers' shutdown, and measures PATCH_RUN_LEAST_S at least. That check gets PATCH_SHARE
# of --max-seconds, more where its run needs it, and nothing (said in the report) where it
# would take more than PATCH_MAX_SHARE of it.
PATCH_SHARE = 0.2
PATCH_MAX_SHARE = 0.4
PATCH_RUN_LEAST_S = 4.0
PATCH_RUN_MARGIN_S = 2.0
PATCH_RUNS = 1


@dataclasses.dataclass(frozen=True)
class Budget:
    """How --max-seconds is divided, decided before anything is measured (plan_budget):
    seconds for the bisection (cache fill, isolated costs, rounds), the advice's check,
    --tune's search and --patch's check of the change. A phase that ends early leaves its
    time to the next; the rounds of an undecided verdict may take the check's and the
    search's (a verdict is worth more than advice checked under none), never the change's.
    `startup_s`: the time before the tool could act (imports; under `run`, your script up
    to the creation of its training loader), not counted. `extra_s`: --verify-seconds, a
    budget of its own on top of --max-seconds."""

    max_seconds: float
    bisecting: float
    checking: float = 0.0
    searching: float = 0.0
    patching: float = 0.0
    patch_runs: int = 0
    startup_s: Optional[float] = None
    extra_s: float = 0.0
    patch_reason: Optional[str] = None  # why the change is not checked within the budget
    # the least of `patching` the change's check needs (its runs' start-ups, margins and
    # least measuring): the rest is the search's while it has no change to check
    patch_least: float = 0.0
    # where the time went, once it has (phases, change.check): {part: seconds}, as parts()
    spent: Optional[dict] = None

    def parts(self) -> list:
        """[(what, seconds)] of the parts planned, in the order they run."""
        named = (("bisecting", self.bisecting), ("checking the advice", self.checking),
                 ("searching", self.searching), ("checking the change", self.patching))
        return [(k, v) for k, v in named if v > 0 or k == "bisecting"]

    def text(self) -> str:
        """'of 120 s: 70 bisecting, 30 searching, 20 checking the change'."""
        parts = ", ".join(f"{v:.0f} {k}" for k, v in self.parts())
        out = f"of {self.max_seconds:g} s: {parts}"
        if self.extra_s:
            out += f" (the advice's check {self.extra_s:g} s more, --verify-seconds)"
        return out

    def to_dict(self) -> dict:
        out = {KEYS[k]: round(v, 3) for k, v in self.parts()}
        if self.patch_runs:
            out["patch_runs"] = self.patch_runs
        if self.extra_s:
            out["verify_seconds"] = self.extra_s
        if self.patch_reason:
            out["patch_reason"] = self.patch_reason
        if self.spent:
            out["spent"] = {k: round(v, 3) for k, v in self.spent.items()}
        return out

    def spending(self, part: str, seconds: float) -> "Budget":
        """This budget with `seconds` spent on `part` (a key of to_dict: bisecting,
        checking, searching, patching)."""
        return dataclasses.replace(self, spent={**(self.spent or {}), part: seconds})


# the parts as the JSON names them (run.budget; its `spent` alike)
KEYS = {"bisecting": "bisecting", "checking the advice": "checking", "searching": "searching",
        "checking the change": "patching"}


def plan_budget(max_seconds: float, *, check_share: float, search_share: float = 0.0, patch: bool = False,
                startup_s: Optional[float] = None, verify_seconds: Optional[float] = None) -> Budget:
    """--max-seconds divided (Budget). `check_share`: the advice's check's share of what
    the change's check leaves; `search_share`: --tune's (0 without it), the check then
    taking `check_share` of the search's; `patch`: --patch, its runs each paying
    `startup_s` (this run's own start-up, or PATCH_RUN_MARGIN_S where not known) before
    measuring; `verify_seconds`: the check's own budget on top (0: off)."""
    m = float(max_seconds)
    patching, runs, reason, need = 0.0, 0, None, 0.0
    if patch:
        per_run = (startup_s or 0.0) + PATCH_RUN_MARGIN_S
        need = PATCH_RUNS * (per_run + PATCH_RUN_LEAST_S)
        if need <= PATCH_MAX_SHARE * m:
            patching, runs = max(PATCH_SHARE * m, need), PATCH_RUNS
        else:
            reason = (f"--max-seconds {m:g} leaves too little to run your script with the change (it starts in about "
                      f"{per_run:.0f} s before it measures): give --max-seconds "
                      f"{math.ceil(need / PATCH_MAX_SHARE / 10) * 10:g} or more")
    rest = m - patching
    searching = search_share * rest
    if verify_seconds is not None:
        checking, extra = 0.0, float(verify_seconds)
    elif search_share:
        checking, extra = check_share * searching, 0.0
        searching -= checking
    else:
        checking, extra = check_share * rest, 0.0
    bisecting = rest - searching - checking
    return Budget(m, bisecting, checking, searching, patching, runs, startup_s, extra, reason,
                  patch_least=need if runs else 0.0)
