"""Progress on stderr while measuring.

The phases emit events (`Experiment.emit`: {"event": "cache"}, {"event": "point", "point",
"index", "total"}, {"event": "window", "point", "window", "max_windows", "index",
"total"}, {"event": "confirm", "transform", "where"}, {"event": "verify", "item",
"settings"}, {"event": "warning", "message"}, {"event": "waiting", "message"}). `describe(event)` turns any of them into
words, in this one place, as a pure function of the event; the writers only write what
it returns:

- `Progress`: one line redrawn by click's progress bar, when stderr is a terminal: what
  is measured, how far along the run is, and the time left against --max-seconds (an
  upper bound: points that settle early end sooner);
- `Lines`: whole lines, for a run inside the user's own script (its own output shares
  the terminal, so nothing is redrawn);
- `Warnings`: where stderr is a log file or a pipe, the warnings only.

A warning (a budget too short for the step, a cache cut short) gets a line of its own
from every writer.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from typing import Callable, Optional, TextIO

import click

from .measure.plan import Plan

STEPS = 1000  # resolution of the bar
BAR_WIDTH = 20


def make_progress(max_seconds: float, *, quiet: bool = False, stream: Optional[TextIO] = None,
                  clock: Callable[[], float] = time.monotonic) -> Optional["Progress"]:
    """A progress callback for `bisect`, or None when quiet. Where `stream` (stderr by
    default) is not a terminal, a log file or a pipe gets no control characters: only
    the warnings seen while measuring, a line each (`Warnings`)."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return None
    if not _isatty(stream):
        return Warnings(stream)
    return Progress(max_seconds, stream, clock=clock)


@dataclasses.dataclass(frozen=True)
class Said:
    """What an event says. `kind`: "status" (what is measured now: the bar's text, a line
    of `Lines`), "detail" (how far within it: the bar only) or "warning" (a line of its
    own everywhere)."""

    text: str
    kind: str = "status"


def describe(event: dict) -> Optional[Said]:
    """The words for one progress event; None for an event no writer shows."""
    kind = event.get("event")
    if kind == "cache":
        return Said("filling the caches")
    if kind == "point":
        return Said(f"measuring {event['point']}{_of(event)}")
    if kind == "window":
        return Said(f"measuring {event['point']}{_of(event)}, window {event['window']}", "detail")
    if kind == "confirm":
        return Said(f"measuring {event['transform']} ({event['where']}) in the pipeline")
    if kind == "verify":
        settings = ", ".join(f"{k}={v}" for k, v in (event.get("settings") or {}).items())
        what = "trying (--tune)" if event.get("item") == "tune" else "measuring the advice"
        return Said(f"{what}: {settings or 'your settings'}")
    if kind == "warning":
        return Said(f"warning: {event['message']}", "warning")
    if kind == "waiting":  # a user's loop with no training loader yet (loop_end.Ending._waiting): a line everywhere
        return Said(event["message"], "warning")
    return None


def _of(event: dict) -> str:
    """The point's place in the run, " (2/5)", where the event says it."""
    index, total = event.get("index"), event.get("total")
    return "" if index is None or total is None else f" ({index + 1}/{total})"


def line_of(said: Said) -> str:
    """A whole line on stderr."""
    return f"bisect-pipeline: {said.text}"


class Warnings:
    """Where stderr is not a terminal: the warnings seen while measuring (e.g. a budget
    too short for the step), a line each, as they come; nothing else."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, event: dict) -> None:
        said = describe(event)
        if said is not None and said.kind == "warning":
            _write_line(self.stream, line_of(said))

    def done(self) -> None:
        return None


def _write_line(stream: TextIO, line: str) -> None:
    try:
        click.echo(line, file=stream)
    except (ValueError, AttributeError, OSError):  # closed, odd or broken: the report still carries it
        pass


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """`progress(event)` redraws the line; `done()` clears it (safe to call twice)."""

    def __init__(self, max_seconds: float, stream: TextIO, *, clock: Callable[[], float] = time.monotonic,
                 columns: Optional[int] = None) -> None:
        self.max_seconds = max_seconds
        self.clock = clock
        self.stream = stream
        self.columns = columns or shutil.get_terminal_size().columns
        self.start: Optional[float] = None
        self.what = "starting"
        self.index, self.total, self.windows, self.max_windows = 0, 1, 0, Plan().windows_per_visit
        self.finished = False
        self.bar = click.progressbar(length=STEPS, file=stream, width=BAR_WIDTH, show_eta=False, show_percent=True,
                                     bar_template="[%(bar)s]  %(info)s", fill_char="#", empty_char="-",
                                     item_show_func=self._fit)

    @property
    def fraction(self) -> float:
        """Points done, plus the current point's windows out of the most it may take."""
        within = min(self.windows, self.max_windows) / self.max_windows
        return min(1.0, (self.index + within) / max(1, self.total))

    def seconds_left(self) -> float:
        return 0.0 if self.start is None else max(0.0, self.max_seconds - (self.clock() - self.start))

    def __call__(self, event: dict) -> None:
        if self.finished:
            return
        if self.start is None:
            self.start = self.clock()  # bisect's own clock starts with its first event
        said = describe(event)
        if said is None:
            return
        kind = event.get("event")
        if kind == "point":
            self.index, self.total, self.windows = event["index"], event["total"], 0
        elif kind == "window":
            self.windows = event["window"]
            self.max_windows = event.get("max_windows") or self.max_windows
        if said.kind == "warning":  # a line of its own above the bar, which is then drawn again
            click.echo("\r\033[K" + line_of(said), file=self.stream)
        else:
            self.what = said.text
        info = f"{self.what}, at most {self.seconds_left():.0f} s left"
        step = max(0, round(self.fraction * STEPS) - self.bar.pos)  # never backwards
        self.bar.update(step, info)
        self.bar.render_progress()  # also when only the text changed

    def _fit(self, info: Optional[str]) -> Optional[str]:
        # "[bar]  NNN%  info" must fit one terminal line, or \r cannot redraw it.
        room = self.columns - (BAR_WIDTH + 2) - 2 - 4 - 2 - 1
        if info is None or len(info) <= room:
            return info
        return info[: max(0, room - 3)] + "..."

    def done(self) -> None:
        """Clear the line and give the cursor back (click hides it while drawing)."""
        if self.finished:
            return
        self.finished = True
        if self.start is not None:
            click.echo("\r\033[K\033[?25h", file=self.stream, nl=False)
            self.stream.flush()


class Lines:
    """Progress as whole lines on stderr, for a run inside the user's own script (loop.py):
    its own output shares the terminal, so nothing is redrawn. One line when the caches
    are filled, per point measured, and per setting the advice's check tries."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self.stream = stream
        self.last = None

    def __call__(self, event: dict) -> None:
        said = describe(event)
        if said is None or said.kind == "detail" or said.text == self.last:
            return
        if said.kind == "status":
            self.last = said.text
        _write_line(self.stream or sys.stderr, line_of(said))

    def done(self) -> None:
        return None
