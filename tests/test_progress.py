"""Progress on stderr, driven by the events `bisect` emits, with a fake terminal and a
fake clock: which point, how far along, how long is left against --max-seconds; nothing
at all when quiet, and only the warnings when the stream is not a terminal."""

from __future__ import annotations

import io
import re

import pytest

from bisect_pipeline import progress as progress_mod
from bisect_pipeline.progress import Lines, Progress, Warnings, describe, make_progress
from conftest import FakeClock


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def frames(stream: io.StringIO) -> list:
    """What the terminal shows after each redraw: the text between carriage returns,
    control sequences removed."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    return [f.rstrip() for f in text.split("\r") if f.strip()]


def percent(frame: str) -> int:
    return int(re.search(r"(\d+)%", frame).group(1))


def run_events(p, clock: FakeClock) -> None:
    p({"event": "cache", "message": "filling the caches"})
    clock.t += 4
    p({"event": "point", "point": "device", "index": 0, "total": 4})
    clock.t += 1
    p({"event": "window", "point": "device", "window": 3, "max_windows": 6, "index": 0, "total": 4})
    clock.t += 2
    p({"event": "point", "point": "collated", "index": 1, "total": 4})
    clock.t += 3
    p({"event": "warning", "message": "the budget is short"})
    p({"event": "window", "point": "collated", "window": 6, "max_windows": 6, "index": 1, "total": 4})


def test_shows_the_point_how_far_and_time_left_against_max_seconds():
    clock, stream = FakeClock(1000.0), FakeTTY()
    p = make_progress(20.0, stream=stream, clock=clock)
    assert isinstance(p, Progress)
    p.columns = 120
    run_events(p, clock)
    shown = frames(stream)
    warned = [f for f in shown if f.startswith("bisect-pipeline: warning:")]
    assert warned == ["bisect-pipeline: warning: the budget is short"]  # a line of its own
    shown = [f for f in shown if f not in warned]
    assert len(shown) == 6  # one redraw per event, and the bar again under the warning
    assert "filling the caches" in shown[0] and "at most 20 s left" in shown[0]
    assert "device (1/4)" in shown[1] and "at most 16 s left" in shown[1]  # 4 s of 20 gone
    assert "device (1/4), window 3" in shown[2] and "at most 15 s left" in shown[2]
    assert "collated (2/4)" in shown[3] and "at most 13 s left" in shown[3]
    assert "collated (2/4)" in shown[4] and "at most 10 s left" in shown[4]
    assert "collated (2/4), window 6" in shown[5] and "at most 10 s left" in shown[5]
    # how far: points done plus the current point's windows out of the most it may take
    assert [percent(f) for f in shown] == [0, 0, 12, 25, 25, 50]
    assert all(f.startswith("[") for f in shown)  # click's bar, drawn with fill/empty chars
    assert "#" * 10 in shown[5] and "-" * 10 in shown[5]


def test_time_left_never_goes_negative_and_the_bar_never_goes_back():
    clock, stream = FakeClock(1000.0), FakeTTY()
    p = make_progress(5.0, stream=stream, clock=clock)
    p.columns = 120
    p({"event": "point", "point": "raw", "index": 2, "total": 4})
    p({"event": "window", "point": "raw", "window": 6, "max_windows": 6, "index": 2, "total": 4})
    clock.t += 60
    p({"event": "point", "point": "raw", "index": 2, "total": 4})  # e.g. a retried point: same index
    shown = frames(stream)
    assert "at most 0 s left" in shown[-1]
    assert percent(shown[-1]) >= percent(shown[-2]) == 75


def test_done_clears_the_line_and_shows_the_cursor_again_once():
    clock, stream = FakeClock(1000.0), FakeTTY()
    p = make_progress(20.0, stream=stream, clock=clock)
    p({"event": "point", "point": "device", "index": 0, "total": 2})
    p.done()
    out = stream.getvalue()
    assert out.endswith("\r\x1b[K\x1b[?25h")
    p.done()
    p({"event": "point", "point": "full", "index": 1, "total": 2})  # after done: nothing more
    assert stream.getvalue() == out


def test_long_lines_are_cut_to_the_terminal_width():
    clock, stream = FakeClock(1000.0), FakeTTY()
    p = Progress(20.0, stream, clock=clock, columns=60)
    p({"event": "point", "point": "full num_workers=4, pin_memory=True, prefetch_factor=8", "index": 0, "total": 9})
    (shown,) = frames(stream)
    assert len(shown) <= 60 and shown.endswith("...")


@pytest.mark.parametrize("tty", [True, False])
def test_nothing_is_written_when_quiet(tty):
    stream = FakeTTY() if tty else io.StringIO()
    assert make_progress(20.0, quiet=True, stream=stream, clock=FakeClock(1000.0)) is None
    assert stream.getvalue() == ""


def test_not_a_terminal_gets_the_warnings_only_as_plain_lines():
    stream, clock = io.StringIO(), FakeClock(1000.0)  # a log file or a pipe
    p = make_progress(20.0, stream=stream, clock=clock)
    assert isinstance(p, Warnings)
    run_events(p, clock)
    p.done()
    assert stream.getvalue() == "bisect-pipeline: warning: the budget is short\n"  # no control characters


def test_stderr_is_the_default_stream(monkeypatch):
    fake = FakeTTY()
    monkeypatch.setattr(progress_mod.sys, "stderr", fake)
    p = make_progress(20.0, clock=FakeClock(1000.0))
    p({"event": "point", "point": "device", "index": 0, "total": 1})
    assert "device (1/1)" in frames(fake)[0]
    monkeypatch.setattr(progress_mod.sys, "stderr", io.StringIO())  # a pipe or a log file
    assert isinstance(make_progress(20.0), Warnings)


def test_a_closed_or_odd_stream_counts_as_not_a_terminal():
    closed = io.StringIO()
    closed.close()
    p = make_progress(20.0, stream=closed)
    assert isinstance(p, Warnings)
    p({"event": "warning", "message": "nowhere to go"})  # the report still carries it
    odd = make_progress(20.0, stream=object())  # not a stream at all
    odd({"event": "warning", "message": "nowhere to go"})


# --- one renderer: every event the code can emit, through every writer -----------------------

# A value for each field an event may carry (a field missing here fails the test below: give it one).
SAMPLE_FIELDS = {"point": "augmented", "index": 1, "total": 4, "window": 2, "max_windows": 6,
                 "transform": "RandomResizedCrop", "where": "dataset.transform[0]", "item": "workers",
                 "settings": {"num_workers": 1, "persistent_workers": True}, "message": "the budget is short"}


def emitted_events() -> dict:
    """Every {"event": KIND, ...} dict literal in the package's code, by kind: its other keys."""
    import ast
    import pathlib

    import bisect_pipeline

    kinds: dict = {}
    for path in pathlib.Path(bisect_pipeline.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Dict):
                continue
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "event" not in keys:
                continue
            kind = node.values[keys.index("event")]
            assert isinstance(kind, ast.Constant), f"{path}:{node.lineno}: an event's kind must be a literal"
            kinds.setdefault(kind.value, set()).update(k for k in keys if k != "event")
    return kinds


def test_the_code_emits_the_known_kinds_of_event():
    # the scan itself must find the events (else the test below would pass on nothing)
    assert set(emitted_events()) >= {"cache", "point", "window", "confirm", "verify", "warning"}


@pytest.mark.parametrize("kind", sorted(emitted_events()))
def test_every_event_the_code_emits_is_worded_and_written_by_every_writer(kind):
    fields = emitted_events()[kind]
    missing = fields - set(SAMPLE_FIELDS)
    assert not missing, f"give SAMPLE_FIELDS a value for {missing}"
    event = {"event": kind, **{k: SAMPLE_FIELDS[k] for k in fields}}
    said = describe(event)
    assert said is not None and said.text and said.kind in ("status", "detail", "warning")
    clock, tty, lines_out, log = FakeClock(1000.0), FakeTTY(), io.StringIO(), io.StringIO()
    bar = Progress(20.0, tty, clock=clock, columns=200)
    lines, warnings = Lines(lines_out), Warnings(log)
    for write in (bar, lines, warnings):
        write(event)
    assert said.text in "".join(frames(tty))  # the bar shows the same words
    written = lines_out.getvalue()
    if said.kind == "detail":
        assert written == ""  # whole lines skip the windows within a point
    else:
        assert written == f"bisect-pipeline: {said.text}\n"
    assert log.getvalue() == (f"bisect-pipeline: {said.text}\n" if said.kind == "warning" else "")


def test_the_confirm_and_verify_events_are_lines_inside_a_script():
    out = io.StringIO()
    lines = Lines(out)
    lines({"event": "point", "point": "full", "index": 0, "total": 5})
    lines({"event": "window", "point": "full", "window": 1, "max_windows": 6, "index": 0, "total": 5})
    lines({"event": "confirm", "transform": "ColorJitter", "where": "dataset.transform[2]"})
    lines({"event": "confirm", "transform": "ColorJitter", "where": "dataset.transform[2]"})  # same: once
    lines({"event": "verify", "item": "workers", "settings": {"num_workers": 2}})
    lines({"event": "verify", "item": "tune", "settings": {"num_workers": 1}})  # the search of --tune
    lines({"event": "warning", "message": "short"})
    assert out.getvalue().splitlines() == [
        "bisect-pipeline: measuring full (1/5)",
        "bisect-pipeline: measuring ColorJitter (dataset.transform[2]) in the pipeline",
        "bisect-pipeline: measuring the advice: num_workers=2",
        "bisect-pipeline: trying (--tune): num_workers=1",
        "bisect-pipeline: warning: short"]


def test_a_window_event_carries_its_point_s_place_from_the_experiment():
    from bisect_pipeline.measure.experiment import Experiment

    seen: list = []
    exp = Experiment.__new__(Experiment)  # only emit's own state
    exp.progress, exp.at = seen.append, None
    exp.emit({"event": "point", "point": "raw", "index": 2, "total": 5})
    exp.emit({"event": "window", "point": "raw", "window": 1, "max_windows": 6})
    exp.emit({"event": "verify", "item": "workers", "settings": {}})
    exp.emit({"event": "window", "point": "full", "window": 1, "max_windows": 6})  # the check's visit: no place
    assert describe(seen[1]).text == "measuring raw (3/5), window 1"
    assert describe(seen[3]).text == "measuring full, window 1"
