"""The loader settings found by measurement (--tune): a search, not a sweep.

After the bisection and the advice's check, the settings the user's loop can change
without changing what it learns from (num_workers, persistent_workers, prefetch_factor,
pin_memory on an accelerator, the step's torch threads on a CPU step) are measured on
the `full` point against the user's own, each candidate as the advice's check measures
one (verify.trial: A B B A visits, the epochs ending as in the user's loop), until:

- a candidate is within the noise of the ceiling (the `device` point: no loader setting
  can beat the step alone), or
- the best candidate's neighbours are measured and none beats it beyond the noise, or
- the budget is spent (--max-seconds).

The space is pruned first from what the bisection measured (`space_of`): nothing to
search when the pipeline keeps up (verdict `none`); num_workers from 0 (1 when a worker
stage is a real cost) to the cores this process may use, and no more than one past the
workers the isolated costs say would feed the step (or, where more, than those that
would feed it at its fastest window: a loaded machine's bursts slow the ceiling's mean);
the search starts at that count.
Each num_workers candidate comes with persistent_workers=True and, on a CPU step whose
threads would compete with the workers, the step's threads lowered to the cores left
(as the advice's candidates, verify.candidates). Around the best count, variants: the
step's threads as the user has them, pin_memory turned over on an accelerator,
prefetch_factor raised. A candidate that raises (a dataset that cannot be pickled
under spawn, pin_memory without an accelerator) is kept as failed, with its error, and
the search goes on.

`propose` (what to measure next) and `summarize` (what the trials say) are pure; Search
is the schedule that yields the visits (as rounds.Rounds and turns.Trials do).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional

from ..core.results import Trial, Tuning
from ..core.stats import Contrast, compare, difference, is_real, unpaired
from ..derive.findings import Diagnosis, Found, Outcome, Tried
from ..derive.drops import STAGES
from ..derive.witness import waits
from ..measure.experiment import Experiment
from ..measure.visit import Visit
from .context import is_graph
from .outcome import FIX, THREADS, compared, interval, outcome, per_batch, read, settings_text, visit_times
from .rules_workers import WAITING_CORES_FACTOR, WORKER_STAGES
from .verify import BLOCK, MIN_BLOCKS, fits, trial
from .written import WRITTEN, Written, choose, compared_with, fix_said, kinds_of


KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", THREADS)
# Share of --max-seconds kept for the check and the search from the rounds after the
# minimum ones, with --tune, the verdict named or inconclusive (verify.VERIFY_SHARE
# without, from the rounds that only settle a named one): the search measures each
# candidate in 4 visits at least, about 1 s each on a 2-core machine, and needs the
# ceiling and stage costs, not a named stage.
TUNE_SHARE = 0.5
# Share of that budget the advice's check may take first; its trials seed the search.
CHECK_SHARE = 0.4
# prefetch_factor tried above the default of 2 (DataLoader's).
PREFETCH = 4
# Candidates the search keeps budget for beyond the one it measures (verify.alternate's
# `owed`): without it the first candidate's undecided blocks would take all that is left.
OWED_CANDIDATES = 2


@dataclasses.dataclass(frozen=True)
class Space:
    """What the search may try (see the module's docstring). `user`: the user's settings
    (KEYS, effective: what DataLoader applies); `workers`: the num_workers it may try,
    ascending; `reason`: why there is nothing to search (then `workers` is empty)."""

    user: dict
    workers: tuple = ()
    start: int = 0
    cores: int = 1
    on_cpu: bool = True
    pin: bool = False
    prefetch: bool = False
    ceiling_ms: Optional[float] = None
    ceiling_rel_se: float = 0.0
    why: str = ""
    reason: Optional[str] = None
    graph: bool = False  # a torchdata.nodes graph: its threads start again at every reset, persistent or not

    def candidate(self, w: int) -> dict:
        """The settings tried for `w` workers: persistent (a DataLoader's), and on a CPU
        step the step's threads lowered to the cores the workers leave when it uses more."""
        full = dict(self.user, num_workers=w)
        if w > 0:
            full.update(persistent_workers=not self.graph, prefetch_factor=full.get("prefetch_factor") or 2)
            lowered = max(1, self.cores - w)
            if self.on_cpu and (self.user.get(THREADS) or 1) > lowered:
                full[THREADS] = lowered
        return effective(full)

    def delta(self, full: dict) -> dict:
        """`full` as the settings that differ from the user's (what a visit applies); a
        prefetch_factor of 2 where the user's is unset is DataLoader's default, no change."""
        user = effective(self.user)
        return {k: full[k] for k in KEYS if full.get(k) != user.get(k)
                and not (k == "prefetch_factor" and (full[k] or 2) == (user[k] or 2))}


def effective(settings: dict) -> dict:
    """Settings as DataLoader applies them: without workers, prefetch_factor and
    persistent_workers do nothing; with workers and no prefetch_factor, 2."""
    out = {k: settings.get(k) for k in KEYS}
    out["num_workers"] = int(out["num_workers"] or 0)
    out["pin_memory"] = bool(out["pin_memory"])
    if out["num_workers"] == 0:
        out["prefetch_factor"], out["persistent_workers"] = None, False
    else:
        out["prefetch_factor"] = out["prefetch_factor"] or 2
        out["persistent_workers"] = bool(out["persistent_workers"])
    return out


def space_of(d: "Diagnosis", *, cores: int, threads: int) -> Space:
    """The space the search may try, pruned from what the bisection measured (see the
    module's docstring); `reason` says why there is nothing to search."""
    lo = d.loader or {}
    user = effective({**{k: lo.get(k) for k in KEYS}, THREADS: threads})
    v = d.verdict
    if v.bottleneck is None:
        return Space(user, reason=f"no verdict ({v.reason})")
    if v.bottleneck == "none":
        return Space(user, reason="the pipeline keeps up with the step (verdict none): no loader setting can make it "
                                  "faster than the ceiling beyond the noise")
    t_ceiling = v.fitted.get(v.ceiling) if v.ceiling else None
    if not t_ceiling:
        return Space(user, reason="the ceiling was not measured")
    t_full = v.fitted.get("full")
    # (a stage named, on either witness, is an input cost: searched, however noisy the gap)
    named = v.bottleneck in STAGES or v.bottleneck == "tie"
    if not named and t_full and v.gap_sigma is not None and not is_real(v.gap_sec_per_batch or 0.0, v.gap_sigma,
                                                                         t_full):
        gap = (v.gap_sec_per_batch or 0.0) * 1e3
        return Space(user, reason=f"your full pipeline is within the noise of the ceiling ({gap:.1f} \u00b1 "
                                  f"{v.gap_sigma * 1e3:.1f} ms per batch apart): no loader setting can make it faster "
                                  "beyond the noise")
    sigma = d.sigma(v.ceiling) or 0.0
    workers_stage = any(s.stage in WORKER_STAGES and s.status == "ok" and s.significant for s in v.stages)
    part = d.isolated.part("workers") if d.isolated is not None else None
    needed = int(part.needed) if part is not None and part.needed else None
    low = 1 if workers_stage else 0
    wait = waits(d.isolated)
    most = cores * WAITING_CORES_FACTOR if wait else cores
    fastest = _needed_at_fastest(d, part) if needed else 0
    high = max(low, min(most, max(needed + 1, fastest))) if needed else max(low, cores)
    start = min(high, max(low, needed)) if needed else min(high, max(low, user["num_workers"] + 1))
    more = f"up to {fastest} at the step's fastest window" if needed and fastest > needed + 1 else "one more at most"
    why = (f"num_workers {low} to {high}: " + ("0 left out, a worker stage is a real cost; " if low else "")
           + (f"{needed} feed the step by the isolated costs, {more}; " if needed else "")
           + f"{cores} cores this process may use"
           + (f" ({wait}: its workers wait more than they compute, up to {most})" if wait else ""))
    on_cpu = str(d.device).startswith("cpu")
    transfer = next((s for s in v.stages if s.stage in ("transfer", "handoff") and s.status == "ok" and s.significant),
                    None)
    return Space(user, tuple(range(low, high + 1)), start, cores, on_cpu,
                 pin=not on_cpu, prefetch=high > 0 and (workers_stage or transfer is not None),
                 ceiling_ms=t_ceiling * 1e3, ceiling_rel_se=sigma / t_ceiling, why=why, graph=is_graph(lo))


def _needed_at_fastest(d: "Diagnosis", part) -> int:
    """The workers that would feed the step at its fastest reading: the workers' work
    alone over the fastest window of any point (each holds a step; none is faster than
    the step alone). The isolated costs divide by the ceiling's mean, which a loaded
    machine's bursts inflate: the search may climb to this many."""
    work = getattr(part, "worker_ms_per_batch", None)
    times = [w.seconds / w.steps for p in d.points if p.ok for w in p.throughput.windows if w.steps]
    return math.ceil(work / (min(times) * 1e3)) if work and times and min(times) > 0 else 0


# --------------------------------------------------------------------------------------
# What the trials say (pure)
# --------------------------------------------------------------------------------------


def tried(space: Space, trials: tuple, batch_size: float) -> list:
    """The trials as the search reads them."""
    out = []
    for t in trials:
        full = effective({**space.user, **t.settings})
        out.append(Tried(space.delta(full), full, outcome(t, batch_size), compared(t) if not t.error else None,
                         t.item or "tune"))
    return out


def at_ceiling(space: Space, t: Tried) -> bool:
    """Is this candidate, one that helps, within the noise of the ceiling's time per batch
    (or below it)? Its time over the ceiling's, in logs, by the one comparison: the
    noise of its speed-up's pairs and the ceiling's own (relative) noise. (One that does
    not help is no closer to the ceiling than the user's.)"""
    ms, ceiling = t.ms_per_batch, space.ceiling_ms
    if ms is None or not ceiling or t.log is None or not math.isfinite(t.log.se) or t.outcome.status != "helps":
        return False
    c = Contrast(math.log(ms / ceiling), math.hypot(t.log.se, space.ceiling_rel_se), t.log.df, t.log.rounds)
    return not (c.estimate > 0 and compare(c, 1.0).real)


def beats(a: Tried, b: Tried) -> bool:
    """Is `a` faster than `b` beyond the noise? Each was measured against the user's in
    its own pairs of visits: the log of their speed-ups' ratio, its noise both trials'
    (at the fewer degrees of freedom), by the one comparison."""
    if a.log is None or b.log is None or a.speedup is None or b.speedup is None:
        return False
    c = difference(a.log, b.log)
    return math.isfinite(c.se) and c.estimate > 0 and compare(c, 1.0).real


def best(ts: list) -> Optional[Tried]:
    """The candidate to recommend: among those that help beyond the noise, the one with
    the fewest workers (then threads, then prefetched batches) of those no slower than the
    fastest beyond the noise; None when none helps."""
    helping = [t for t in ts if t.outcome.status == "helps"]
    if not helping:
        return None
    top = max(helping, key=lambda t: t.speedup)
    close = [t for t in helping if t is top or not beats(top, t)]
    return min(close, key=lambda t: (t.full["num_workers"], t.full.get(THREADS) or 0, t.full["prefetch_factor"] or 0,
                                     -t.speedup))


def propose(space: Space, ts: list) -> tuple[Optional[dict], str]:
    """(the next candidate's settings, ""), or (None, why the search stops)."""
    if space.reason:
        return None, space.reason
    if any(t.outcome.status == "helps" and at_ceiling(space, t) for t in ts):
        return None, "a candidate is within the noise of the ceiling"
    # a candidate cut short by a budget (the check's, for a seed) is measured again, first:
    # continued (Search), its visits and its pool already paid for
    done = [t.full for t in ts if t.outcome.status != "not measured"] + [effective(space.user)]
    order = [full for full in _order(space, ts) if full not in done]
    cut = [t.full for t in ts if t.outcome.status == "not measured" and t.full in order]
    if cut or order:
        return space.delta((cut + order)[0]), ""
    return None, "the best candidate's neighbours are measured"


def _order(space: Space, ts: list) -> Iterator[dict]:
    """The candidates in the order worth measuring: the first count (where the isolated
    costs say the workers feed the step) and one on each side of it, with its threads
    (the answer is likeliest there, and the three say which way the climb goes); on a
    CPU step, the best count with the step's threads the other way (lowered beside the
    workers, or the user's: a heavy step loses more to fewer threads than the workers
    take from it); then the neighbours of the best count so far, with its threads (a
    climb: a neighbour no faster beyond the noise ends it); then the variants of the
    best."""
    first = space.candidate(space.start)
    yield first
    for nb in (space.start + 1, space.start - 1):
        if nb in space.workers:
            yield _count(space, nb, first.get(THREADS) == space.user.get(THREADS))
    counts = [t for t in ts if t.speedup is not None and t.full in (_count(space, t.full["num_workers"], True),
                                                                     _count(space, t.full["num_workers"], False))]
    # the climb's centre: the best count (a faster one within the noise does not move it)
    centre = best(counts) or max(counts, key=lambda t: t.speedup, default=None)
    full = centre.full if centre is not None else first
    w, users = full["num_workers"], full.get(THREADS) == space.user.get(THREADS)
    if space.on_cpu and w > 0:
        yield _count(space, w, not users)
    for nb in (w + 1, w - 1):
        if nb in space.workers:
            yield _count(space, nb, users)
    base = best(ts) or centre
    yield from _variants(space, base.full if base is not None else first)


def _count(space: Space, w: int, user_threads: bool) -> dict:
    """The candidate for `w` workers, with the user's threads for the step or lowered
    beside the workers (Space.candidate)."""
    full = space.candidate(w)
    return effective(dict(full, **{THREADS: space.user.get(THREADS)})) if user_threads else full


def _variants(space: Space, full: dict) -> Iterator[dict]:
    """The best's variants: pin_memory turned over (accelerator), prefetch_factor raised,
    persistent workers."""
    w = full["num_workers"]
    if space.pin:
        yield effective(dict(full, pin_memory=not full["pin_memory"]))
    if w > 0 and space.prefetch and (full["prefetch_factor"] or 2) < PREFETCH:
        yield effective(dict(full, prefetch_factor=PREFETCH))
    if w > 0 and not full["persistent_workers"] and not space.graph:
        yield effective(dict(full, persistent_workers=True))


# --------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------


class Search:
    """The search as a schedule: yields the visits of each candidate's trial (verify.trial)
    within `budget_s` of the experiment's clock; `result` is the report's `tune`
    (results.Tuning). `seeds`: trials already measured (the advice's check's), read as
    candidates of the search. `reach_s`: while no candidate helps there is no change to
    check, and the search runs on into the time kept for the change's check, up to this
    many seconds from its start (the experiment's end moved with it): no share is held
    for work that may not come."""

    def __init__(self, exp: Experiment, space: Space, *, budget_s: float, seeds: tuple = (),
                 reach_s: float = 0.0) -> None:
        self.exp = exp
        self.space = space
        self.budget_s = budget_s
        self.reach_s = max(budget_s, reach_s)
        self.trials: list = [t for t in seeds if t.settings and FIX not in t.settings]  # (a fix: not a setting)
        self.result = self._record("not run", None, 0.0)

    def __iter__(self) -> Iterator[Visit]:
        exp = self.exp
        start = exp.clock()
        stopped = "out of time"
        try:
            while True:
                ts = tried(self.space, tuple(self.trials), exp.batch_size)
                settings, why = propose(self.space, ts)
                deadline = start + (self.budget_s if best(ts) is not None else self.reach_s)
                if settings is None or not fits(exp, "full", deadline):
                    stopped = why if settings is None and not self._cut() else stopped
                    break
                exp.end = max(exp.end, deadline)  # (into the change's share: the hard end moves with it)
                exp.emit({"event": "verify", "item": "tune", "settings": settings})
                full = effective({**self.space.user, **settings})
                cut = next((i for i, x in enumerate(ts) if x.full == full and x.outcome.status == "not measured"
                            and not self.trials[i].error), None)
                resume = self.trials.pop(cut) if cut is not None else None
                t = yield from trial(exp, "tune", settings, deadline, owed=len(BLOCK) * MIN_BLOCKS * OWED_CANDIDATES,
                                     resume=resume)
                self.trials.append(t)
                before = 0 if resume is None else len(resume.user_windows) + len(resume.candidate_windows)
                if not t.error and len(t.user_windows) + len(t.candidate_windows) == before:
                    # no visit of it fitted what is left (verify.alternate measures none that
                    # cannot show two windows): another candidate would fare no better
                    stopped = "out of time: a visit of your pipeline takes longer than what was left"
                    break
        finally:
            status = "skipped" if self.space.reason else ("ok" if self.trials else "out of time")
            self.result = self._record(status, stopped, exp.clock() - start)

    def _cut(self) -> bool:
        """Was the last trial cut short by the budget (a side without two windows)?"""
        last = self.trials[-1] if self.trials else None
        return last is not None and not last.error and (len(last.user_windows) < 2 or len(last.candidate_windows) < 2)

    def _record(self, status: str, stopped: Optional[str], elapsed: float) -> Tuning:
        s = self.space
        return Tuning(status=status, reason=s.reason, budget_s=round(self.budget_s, 3), elapsed_s=round(elapsed, 3),
                      user=dict(s.user), workers=s.workers, start=s.start if s.workers else None, why=s.why or None,
                      ceiling_ms_per_batch=None if s.ceiling_ms is None else round(s.ceiling_ms, 3),
                      ceiling_rel_se=round(s.ceiling_rel_se, 4), trials=tuple(self.trials), stopped=stopped)


def space_of_record(t: Tuning, cores: int = 1) -> Space:
    """The Space a Tuning record was searched in (for summarize on a loaded document)."""
    return Space(dict(t.user or {}), tuple(t.workers or ()), t.start or 0, cores,
                 ceiling_ms=t.ceiling_ms_per_batch, ceiling_rel_se=t.ceiling_rel_se or 0.0, why=t.why or "",
                 reason=t.reason)


# --------------------------------------------------------------------------------------
# What it found (pure): the report's tune section
# --------------------------------------------------------------------------------------


def written(t: Tuning, checks: tuple, batch_size: float, kinds: tuple = WRITTEN) -> Optional[Written]:
    """What `--patch` writes (written.choose: the search's best, and a fix of the pipeline
    where the advice's check, `checks` its trials, measured it to help; `kinds`: the fixes
    the script can be given), or None where nothing is to be written."""
    space = space_of_record(t)
    ts = tried(space, t.trials, batch_size)
    return _written(t, space, ts, best(ts), checks=checks, batch_size=batch_size, kinds=kinds)


def _written(t: Tuning, space: Space, ts: list, b: Optional[Tried], *, checks: tuple, batch_size: float,
             kinds: tuple) -> Optional[Written]:
    """written, on the record's space, its candidates' outcomes `ts` and their best `b`."""
    fixes = [x for x in checks if x.item in WRITTEN and (x.settings or {}).get(FIX) == x.item]
    searched = t.trials[ts.index(b)] if b is not None else None
    on_best = [x for x in fixes if x.base and b is not None and effective({**space.user, **x.base}) == b.full]
    return choose(None if b is None else b.settings, searched, fixes, on_best, batch_size, kinds=kinds)


def summarize(t: Tuning, batch_size: float, graph: bool = False, checks: tuple = ()) -> Found:
    """The report's reading of a Tuning record (see Found); `graph`: a torchdata.nodes
    graph's, its settings worded on its nodes (outcome.settings_text); `checks`: the
    advice's check's trials (the device tail's figures, where the change holds it:
    written)."""
    space = space_of_record(t)
    ts = tried(space, t.trials, batch_size)
    b = best(ts)
    top = b is not None and at_ceiling(space, b)
    user_ms = next((x.outcome.ms_per_batch[0] for x in ts if x.outcome.ms_per_batch), None)
    ceiling = round(user_ms / t.ceiling_ms_per_batch, 4) if user_ms and t.ceiling_ms_per_batch else None
    w = _written(t, space, ts, b, checks=checks, batch_size=batch_size, kinds=kinds_of(t.patch))
    applied = agrees = None
    if t.applied is not None:
        applied = applied_outcome(t.applied, w.users if w else None, batch_size)
        agrees = _agrees(t.applied, b, w, batch_size)
    fix = fix_said(w, batch_size)
    return Found(tuple(ts), b, top, ceiling, _summary(t, ts, b, top, ceiling, graph=graph) + fix,
                 applied, agrees, compared_with(w, batch_size, graph), w is None or w.whole, fix.strip())


def applied_outcome(applied: Trial, searched: Optional[Trial], batch_size: float) -> Outcome:
    """The patched script's speed (change.check: its own run, the windows of its full
    point, one visit a round) over the user's settings as the search measured them in
    this process (`searched`: the best's trial, its user side), on the two runs' visits
    unpaired (stats.unpaired: they were not taken in alternation); ms per batch: the
    search's for yours, the patched script's. An older document's check (the original
    and the patched script in alternating runs) reads as the advice's check does."""
    if applied.user_windows or applied.error:
        return outcome(applied, batch_size)
    mine = visit_times(searched.user_windows) if searched is not None else {}
    patched = visit_times(applied.candidate_windows)
    if not mine or not patched:
        return Outcome(applied.settings, "not measured", reason="no window of your settings in the search, or of "
                                                                "the patched script")
    pair = Trial(applied.item, applied.settings, searched.user_windows, applied.candidate_windows)
    return read(applied.settings, unpaired(list(mine.values()), list(patched.values())), per_batch(pair))


def _agrees(applied: Optional[Trial], b: Optional[Tried], w: Optional[Written],
            batch_size: float) -> Optional[bool]:
    """Does the patched script's speed agree with the figure of what the change holds
    (written: the best's trial, or the device tail's with it; the one comparison on the
    log of their ratio: the patched script's visits against that trial's candidate visits,
    unpaired; an older document's alternating runs: their speed-up against the best's,
    both trials' noise)? None when either is missing. The search's windows hold the pause
    at each epoch's start (its visits end their epochs as the loop does), the patched
    run's do not: its figure is a range, from its windows' time to that plus the pause
    its run estimated (at most: its first batch less a step), and it agrees unless the
    search's figure lies beyond the noise on either side of it; where the figure is the
    settings' alone and the change holds the tail too (`whole` False), unless the patched
    script is slower than it beyond the noise."""
    if applied is None or applied.error or w is None:
        return None
    if applied.user_windows:
        c = compared(applied)
        if c is None or b is None or b.log is None:
            return None
        d = difference(c, b.log)
        return None if not math.isfinite(d.se) else not compare(d, 1.0).real
    ours = list(visit_times(w.reference.candidate_windows).values())
    patched = list(visit_times(applied.candidate_windows).values())
    if not ours or not patched:
        return None
    pause = (applied.epoch_ms_per_batch or 0.0) / 1e3
    low = unpaired(ours, patched)  # log(search / patched): < 0, the search faster than its windows
    high = unpaired(ours, [t + pause for t in patched])  # > 0, the search slower than them with the pause
    if not (math.isfinite(low.se) and math.isfinite(high.se)):
        return None
    faster = w.whole and high.estimate > 0 and compare(high, 1.0).real
    return not ((low.estimate < 0 and compare(low, 1.0).real) or faster)


def _summary(t: Tuning, ts: list, b: Optional[Tried], top: bool, ceiling: Optional[float], *, graph: bool) -> str:
    if t.reason:
        return f"Nothing to tune: {t.reason}."
    if not ts:
        return f"Nothing was measured: {t.stopped or 'out of time'} (raise --max-seconds)."
    if b is None:
        ok = [x for x in ts if x.outcome.status not in ("failed", "not measured")]
        if not ok:  # nothing measured is not "yours is the best"
            return (f"None of the {len(ts)} setting(s) tried could be measured ({t.stopped or 'out of time'}): each "
                    "needs two pairs of visits of your pipeline, one with yours and one with it; raise --max-seconds.")
        unmeasured = f" ({len(ts) - len(ok)} more could not be measured)" if len(ok) < len(ts) else ""
        return (f"None of the {len(ok)} setting(s) {'measured' if unmeasured else 'tried'} beats yours beyond the "
                f"noise{unmeasured}: keep your settings.")
    fig = f"{b.speedup:.2f}\u00d7" + (f" ({interval(b.outcome)})" if interval(b.outcome) else "")
    where = ("within the noise of the ceiling" if top else
             f"the ceiling is {ceiling:.2f}\u00d7" if ceiling else "the ceiling is not known")
    return f"Best: {settings_text(b.settings, graph)}: {fig} your speed; {where}."

