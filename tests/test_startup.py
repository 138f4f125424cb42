"""The run's start-up is this program's own (api.program_start): a process exec'd in place
by a shell that worked first (bash -c "pip install -e . && bisect-pipeline demo" execs its
last command) keeps the shell's fork time, and that work is not counted."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bisect_pipeline import api

SHELL_WORK_S = 10.0


def test_a_process_forked_long_before_its_first_line_counts_from_that_line(monkeypatch):
    first = time.perf_counter() - 2.0  # this program's first line ran 2 s ago
    monkeypatch.setattr(api, "_process_age", lambda: 2.0 + SHELL_WORK_S)  # forked by a shell 10 s before it
    assert api.program_start(first) == first
    # forked just before its first line (the interpreter's own start): counted from the fork
    monkeypatch.setattr(api, "_process_age", lambda: 2.1)
    assert api.program_start(first) == pytest.approx(first - 0.1, abs=0.05)
    # no /proc: from the first line
    monkeypatch.setattr(api, "_process_age", lambda: None)
    assert api.program_start(first) == first


PROBE = ("import time, bisect_pipeline.api as a; a.mark_process_start(); "
         "print(time.perf_counter() - a.PROCESS_START[0], a._process_age())")


@pytest.mark.e2e
def test_exec_d_by_a_shell_that_worked_10_s_first_the_start_up_is_the_program_s_own():
    # the shell sleeps 10 s, then execs python in place (same process, same fork time)
    out = subprocess.run(["bash", "-c", f"sleep {SHELL_WORK_S:g} && exec {sys.executable} -c '{PROBE}'"],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    startup, forked = float(out[0]), float(out[1])
    assert forked >= SHELL_WORK_S  # the fork time is the shell's: read from it, 10 s more
    assert startup < SHELL_WORK_S - 2.0  # the imports (torch's) only
