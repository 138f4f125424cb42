"""How a loop.Session ends, and what it reports. The report is made where the experiment
stands (at the verdict, when the session closes, when the script calls os._exit), with
how the script ended first and what the measurement needed (`_shortfall`), or of nothing
measured where no loader was chosen; it goes to `on_report`, and the loop is stopped
with ScriptStopped or, with keep_training, trains on. Never silent: a loop with no
loader the tool can cache is told so, and stopped after --max-seconds with one paragraph
that says why. Separate from the session's watch of the loop (loop.py): what follows
once the experiment or the script is over. `Ending` is a base of loop.Session: its
methods read the session's state, set in Session.__init__.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import loop_target
from .advise import change
from .core import faults
from .core.results import Measurements, PointResult
from .derive.drops import POINTS
from .loop_loaders import Seen, epoch_length
from .measure import devices, distributed, graph
from .pipeline.integrations import nodes
from .report import Report
from .report.ranks import combine

# A loop with no training loader chosen is told it waits after this share of --max-seconds
# (6 s at the default 60): a loop that accumulates gradients takes several batches before
# its first step, at which its loader is chosen, and a short script with no loader ends
# with its one paragraph alone.
SAY_WAITING_SHARE = 0.1


class ScriptStopped(BaseException):
    """Raised in the user's loop once the report is made: it stops the script cleanly.
    A BaseException, so that the script's `except Exception` does not swallow it."""

    def __init__(self, report: Optional[Report] = None, error: Optional[BaseException] = None) -> None:
        super().__init__("bisect-pipeline has its verdict: the script is stopped")
        self.report = report
        self.error = error


def _left(ended: tuple) -> str:
    """How the script ended on this rank, in words (a rank that left the lockstep)."""
    how, detail = ended
    if how == "exit":
        return f"its script exited (code {detail})"
    if how == "raised":
        return f"its script raised {type(detail).__name__}: {str(detail)[:200]}"
    return "its script ended"


class Ending:
    """How a session ends (see the module's docstring): a base of loop.Session."""

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
            self.script_ended("exit", code)
            self.close()
        finally:
            real(code)

    def _stop_graphs(self) -> None:
        """Before the tool stops the script: the threads of the node graphs it iterated
        (its own iterators, left running in its loop) are stopped, or the interpreter's
        exit aborts in them (a thread inside torch at exit: 'terminate called without an
        active exception')."""
        for ref in self._loaders.values():
            loader = ref()
            if loader is not None and nodes.is_graph(loader):
                graph.shutdown(loader)

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
        """What the loop iterates (loop_target.of), or, where it takes batches of `seen`'s
        loader without a `for` over it, that loader at the loop's line."""
        ref = self._loaders.get(seen.index) if seen is not None else None
        return loop_target.of(frame, ref() if ref is not None else None, seen.index if seen else None, self._site_of)

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

    def _measured(self, interrupted: bool) -> Report:
        """This rank's report of what the experiment measured so far."""
        early = self.ended is not None and not interrupted  # the script ended before the experiment did
        m = self.exp.measurements(self.options.points, held=self.held.record(), interrupted=interrupted, mode="loop",
                                  source=self.source(self._shortfall() if early else None),
                                  unreached="your script ended first" if early else None)
        if m.tune is not None:  # --tune: the best settings written against the script (change.py)
            m = change.patched(m, self.argv)
        return Report.of(m)

    def _report(self, interrupted: bool) -> None:
        coord = self._coord
        if coord is not None and self.stopped is None and self.ended is not None and self.ended[0] == "raised" \
                and distributed.peer_lost(self.ended[1]):  # the script's own all-reduce failed: a rank is lost
            self.stopped, self.ended = distributed.RankLost(self.ended[1]), None
        report = self._measured(interrupted or self.stopped is not None)
        if coord is not None:  # every surviving rank's result (distributed.gather_reports), also when stopped
            stop = self.stopped
            if stop is None and (interrupted or self.ended is not None):
                # the script ended, or was interrupted, on this rank, outside the ranks' agreements: it leaves
                # its result on the board for the others (distributed.leave)
                stop = distributed.Stopped({coord.rank: "SIGINT"} if interrupted else {}, in_step=False,
                                           how=distributed.Stopped.LEFT)
                stop.left = _left(self.ended) if self.ended is not None else "interrupted"
            if faults.RESCUE[0] is not None:
                faults.RESCUE[0].final()
            report = combine(report, distributed.gather_reports(report, coord, self.exp.waits, stop), coord.rank)
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
                "epoch_batches": epoch_length(self.chosen), "epoch_needs": per_epoch}

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
