"""The answer first: what every report (text, HTML, notebook, `--brief`) opens with, and
the grouped warnings that follow it. One place for both renderers (pure functions of
the Report).

The summary is at most SUMMARY_LINES lines at WIDTH columns:

    the verdict with its cost and what it holds back        (Report.summary)
    how firm it is                                           (settled, after N rounds)
    the one change to make first, with its measured figure   (advice, or --tune's best)
    what to measure next, when nothing is settled            (rounds that would tell)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..advise import context, wording
from ..advise.diagnose import POINT_KINDS, point_kinds, points_note
from ..advise.outcome import interval
from ..derive.findings import Diagnosis, Finding
from ..derive.verdict import rounds_to_decide, steady_disagreement
from .figures import ended_parts, incomplete_why


SUMMARY_LINES = 6
# A check that says the candidate is no fix (or could not run it) names no first change.
_NOT_A_FIX = ("no gain", "slower", "failed")


@dataclasses.dataclass(frozen=True)
class Summary:
    """The summary's parts (see the module's docstring); `first_item` is the advice item
    the first change is (the advice list says so instead of saying it again), None when
    the first change is --tune's best or there is none."""

    verdict: str
    status: str = ""
    first: str = ""
    incomplete: str = ""
    next: str = ""
    first_item: Optional["Finding"] = None

    def paragraphs(self, firm: bool = True) -> list:
        """The summary as its paragraphs: the verdict with how firm it is (not with
        `firm` False), the first change, what to measure next (each starts a line)."""
        head = " ".join(x for x in (self.verdict, self.incomplete, self.status if firm else "") if x)
        return [p for p in (head, self.first, self.next) if p]


def summarize(r: "Diagnosis") -> Summary:
    """The summary of a report (see Summary)."""
    first, item = _first_change(r)
    why = "" if r.complete else f"Incomplete run ({incomplete_why(r.interrupted, r.measurements.source)})."
    step = next_step(r)
    return Summary(r.summary, _status(r), first, why, f"Next: {step}" if step else "", item)


def first_item(r: "Diagnosis") -> Optional["Finding"]:
    """The advice item to make first: the first whose check measured a gain, else the
    first not shown to be no fix by its check; None without one. Never a fix its check
    refused, nor one that changes the augmentation (random transforms moved to the device:
    one draw per batch), which the user decides on."""
    offered = [f for f in r.advice if not f.numbers.get("refused") and not f.numbers.get("changes_augmentation")]
    helps = [f for f in offered if f.verified is not None and f.verified.status == "helps"]
    if helps:
        return helps[0]
    return next((f for f in offered if f.verified is None or f.verified.status not in _NOT_A_FIX), None)


def _first_change(r: "Diagnosis") -> tuple:
    """('First change: ...', the advice item it is, or None for --tune's best)."""
    best = r.tune.best if r.tune is not None else None
    if best is not None and best.speedup is not None:
        around = interval(best.outcome)
        fig = f"measured {best.speedup:.2f}\u00d7" + (f" ({around})" if around else "")
        graph = context.is_graph(r.loader)  # a node graph's settings, on its nodes
        fix = f" {r.tune.fix}" if r.tune.fix else ""  # the change written holds a fix with the settings
        return (f"First change, the best --tune found: set {wording.settings_action(best.settings, graph)}: {fig} "
                f"your speed.{fix}"), None
    f = first_item(r)
    if f is None:
        return "", None
    head = wording.headline(f)
    return f"First change: {head[:1].lower()}{head[1:]}", f


def _status(r: "Diagnosis") -> str:
    """How firm the verdict is: 'Settled after 4 rounds (13.8 s of measuring).'"""
    run = r.run
    if r.bottleneck is None or run.verdict_s is None:
        return ""
    rounds = run.rounds or 0
    by = f"; {run.settled_by}" if run.settled and run.settled_by else ""
    after = f"({rounds} round{'s' if rounds != 1 else ''}, {run.verdict_s:.1f} s{by})"
    return f"Settled {after}." if run.settled else f"Not settled {after}."


def next_step(r: "Diagnosis") -> str:
    """What to measure next, where nothing is settled: the rounds that would tell, and
    the --max-seconds that holds them about; '' where the verdict is settled. The
    summary's "Next:" line, and the document's verdict.next."""
    v, run = r.verdict, r.run
    ended = ended_parts(r.measurements.source, r.bottleneck)
    if ended is not None and ended[1]:
        return f"{ended[1][:1].lower()}{ended[1][1:]}"
    more = _more_rounds(r)
    if v.bottleneck is None:
        if r.complete:
            return ""
        if r.interrupted:
            return "run it again to its end: it was interrupted before a verdict."
        least = run.least_verdict_s
        if least and run.limited_by != "batches" and (not run.max_seconds or least > run.max_seconds):
            return (f"rerun with --max-seconds {least} or more: the run ended before a verdict, and about {least} s "
                    "hold one reading of each point a verdict needs at its steps.")
        return f"{more}: the run ended before a verdict."
    need, what = None, ""
    if v.bottleneck == "inconclusive" and v.witness == "disagree" and steady_disagreement(v):
        return ("more rounds would not tell: they read the same in each; the stages timed alone miss what your loop "
                "pays for them.")
    if v.bottleneck == "inconclusive":
        t_full, gap = v.fitted.get("full"), v.drop("full", v.ceiling) if v.ceiling else None
        if gap is None or gap.rounds is None or not t_full:
            return f"close other work on this machine, or {more} for more rounds."
        need = rounds_to_decide(dataclasses.replace(gap, estimate=v.gap_sec_per_batch or 0.0), t_full)
        if need is None:
            return "more rounds would not tell at this noise: close other work on this machine and rerun."
        what = f"of full and {v.ceiling} would tell"
    elif v.bottleneck == "tie" and v.witness != "disagree":
        behind = [lead for lead in v.leads if not lead.real and lead.over in v.tied]
        tell = [lead.rounds_to_tell for lead in behind if lead.rounds_to_tell]
        if tell:
            need, what = max(tell), "would tell " + " and ".join(v.tied) + " apart"
        elif behind and all((lead.rounds or 0) >= 2 for lead in behind):  # their spread known: Lead.rounds_to_tell
            return ("more rounds would not tell them apart at this noise: close other work on this machine, "
                    "or treat them as one cost.")
    elif run.settled or run.verdict_s is None:
        return ""
    if need is None:
        return f"{more} for more rounds, or close other work on this machine."
    seconds = rerun_seconds(r, need)
    so_far = f" ({run.rounds} so far)" if run.rounds else ""
    rerun = f"rerun with --max-seconds {seconds} or so" if seconds else "raise --max-seconds"
    if run.limited_by == "batches":
        times = -(-need // run.rounds) if run.rounds else None
        rerun = (f"{more} (its batches ended the rounds, not --max-seconds"
                 + (f"; about {times}x as many)" if times and times > 1 else ")"))
    return f"about {need} rounds {what}{so_far}: {rerun}, or close other work on this machine."


def _more_rounds(r: "Diagnosis") -> str:
    """What buys more rounds: a larger --max-seconds, or, where the user's script had no
    more batches for them (run.limited_by), more of its epochs or steps."""
    return "run your script for more epochs or steps" if r.run.limited_by == "batches" else "raise --max-seconds"


def rerun_seconds(r: "Diagnosis", rounds: int) -> Optional[int]:
    """About the --max-seconds that holds `rounds` rounds at this run's pace: its seconds
    per round, over the share of --max-seconds it gave the bisection (plan.Budget),
    rounded up to 10 s; None without the figures."""
    run = r.run
    if not run.rounds or not run.verdict_s or not run.max_seconds:
        return None
    share = ((run.budget or {}).get("bisecting") or run.max_seconds) / run.max_seconds
    seconds = rounds * run.verdict_s / run.rounds / max(share, 1e-3)
    return int(math.ceil(max(seconds, run.max_seconds) / 10.0) * 10)


def warnings(r: "Diagnosis") -> list:
    """The warnings (results.Note), one line each with its next step, in the order the
    notes came: the notes of one kind about points (diagnosis.POINT_KINDS: noisy, cut
    short, unsteady, paused) grouped into one line where their first came. Where the
    user's script ended first, what happened is said above the warnings (with what to run
    instead): the `batches` note, its shortfall foretold, is not said again."""
    out, grouped = [], set()
    ended = ended_parts(r.measurements.source, r.bottleneck) is not None
    for n in r.notes:
        if n.kind == "batches" and ended:
            continue
        if n.kind in POINT_KINDS and n.derived and n.point:
            if n.kind not in grouped:
                grouped.add(n.kind)
                at = [p for p in r.points if n.kind in point_kinds(p)]
                out.append(points_note(n.kind, at) if at else n)
        else:
            out.append(n)
    return out
