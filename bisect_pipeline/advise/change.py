"""The change itself, under `run --tune`: the best settings the search found written
against the user's script (patch.py), and, with `--patch FILE`, checked after the change.

`patched(m, argv)`: the measurements with the tune section's `patch` (the search's best,
and a fix of the pipeline where the advice's check measured it to help: written.py), made where
the training loader was created (the report's `source.created_at`): the diff, the flags to
rerun with, the environment; the allocator's variables where the report found they
matter. Never writes the user's file.

`check(m, ...)`: the patched script run as the user would run it, once: the search has
measured the setting against the user's in this process already, so the run confirms
what only it can, in as few runs of the script as that needs (plan.PATCH_RUNS): that the
script builds its training loader with the change (the run's `loader` settings), and
that its speed agrees with the figure of what the change holds (written.py: the search's
for the settings, the check's for the fix with them or alone). The run
is `bisect-pipeline run --points full` of the patched script in a process of its own,
its loop measured with the full pipeline for the time left, the allocator held still as
the search held it; the patched file is a temporary copy beside the original (so that
its imports resolve), removed after; flags go on its command line, variables in its
environment. The windows of its full point, one visit a round, are the `applied` trial's
candidate side; its speed over the user's settings is read against the search's visits
of them (tune.applied_outcome).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from ..core.results import Measurements, Trial, VisitWindow
from ..measure.plan import PATCH_RUN_LEAST_S, PATCH_RUN_MARGIN_S, PATCH_RUNS
from . import edits, patch as patch_mod, tune
from .outcome import FIX, FIX_WORDS, THREADS
from .written import WRITTEN, fix_in, kinds_of

# The patched script's copy, beside the original.
COPY_SUFFIX = "_bisect_tuned"
# A run still going at the end of its share of the budget is sent SIGTERM (it writes its
# partial report, its windows so far), and killed this long after.
TERM_GRACE_S = 3.0


def settings_to_write(m: Measurements, kinds: tuple = WRITTEN) -> Optional[dict]:
    """What the change gives the script (tune.written: the search's best, with a fix of
    `kinds` where the advice's check measured it to help), with the allocator's variables
    where the report measured they help."""
    w = tune.written(m.tune, checks(m), m.batch_size, kinds) if m.tune is not None else None
    if w is None:
        return None
    out = dict(w.settings)
    held = m.isolated.allocator if m.isolated is not None and m.isolated.ok else None
    if held is not None and held.ok and held.real:
        out["env"] = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "-1"}
    return out


def checks(m: Measurements) -> tuple:
    """The advice's check's trials (the fixes' figures: tune.written)."""
    return m.verification.trials if m.verification is not None else ()


def _fix(m: Measurements, kind: Optional[str]) -> Optional[dict]:
    """The Fix of `kind` as the check built it (its JSON form: patch_tail, patch_decode), or None."""
    fixes = (m.verification.fixes if m.verification is not None else None) or ()
    return next((f.to_dict() for f in fixes if kind is not None and f.kind == kind), None)


def created_at(m: Measurements) -> tuple[Optional[str], Optional[int]]:
    """(file, line) where the training loader was created, from the report's source."""
    where = (m.source or {}).get("created_at")
    if not where or ":" not in where:
        return None, None
    path, _, line = where.rpartition(":")
    return path, int(line) if line.isdigit() else None


def patched(m: Measurements, argv: Optional[list] = None) -> Measurements:
    """The measurements with the tune section's patch (see the module's docstring);
    unchanged without a search or a best setting."""
    t = m.tune
    settings = settings_to_write(m)
    if t is None or settings is None:
        return m
    path, line = created_at(m)
    if m.mode != "loop":
        p = patch_mod.Patch(reason="with --entry the tool does not see where your loader is built: run your script "
                                   "with bisect-pipeline run --tune for the change itself")
    elif path is None or not os.path.isfile(path):
        p = patch_mod.Patch(path=path, line=line, reason="where the loader was created is not a file the tool can "
                                                         f"read ({path or 'not known'})")
    elif _installed(path):
        p = patch_mod.Patch(path=path, line=line, reason=f"the loader was created in an installed library ({path}:"
                                                         f"{line}), not in your code: set the settings where you call it")
    else:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            source = fh.read()
        current = {**{k: (m.loader or {}).get(k) for k in patch_mod.LOADER_KEYS}, THREADS: (t.user or {}).get(THREADS)}
        p = _written(m, source, path, line, settings, current=current)
    doc = p.to_dict()
    if argv and not p.reason:
        doc["command"] = p.command(argv)
    if p.diff and os.path.relpath(path).startswith(".."):  # the diff names the file by its name: apply it there
        doc["apply_in"] = os.path.dirname(path)
    return dataclasses.replace(m, tune=dataclasses.replace(t, patch=doc))


def _written(m: Measurements, source: str, path: str, line: Optional[int], settings: dict, *, current: dict):
    """The Patch of `settings`; where the fix chosen cannot be written in the script, the
    other fix the check measured to help where it can be (written.choose without the
    first), else the settings alone: each fix left out says why in a Change of its own
    (the check then compares the patched script with what the diff holds: tune.written)."""
    kinds, missed = WRITTEN, ()
    while True:
        p = _make(source, path, line, settings, current, fix=_fix(m, settings.get(FIX)))
        kind = settings.get(FIX)
        if kind is None or fix_in(p.to_dict()) == kind:
            break
        missed += tuple(c for c in p.changes if c.setting == kind)
        kinds = tuple(k for k in kinds if k != kind)
        again = settings_to_write(m, kinds)
        if again is None or again.get(FIX) is None:
            p = _make(source, path, line, again, current, fix=None) if again else p
            break
        settings = again
    kept = tuple(c for c in p.changes if c.setting not in WRITTEN or c.how != "not applied")
    return dataclasses.replace(p, changes=kept + missed) if missed else p


def _make(source: str, path: str, line: Optional[int], settings: dict, current: dict, *, fix: Optional[dict]):
    """patch.make; where the fix cannot be written in the script, the settings alone, the
    fix's Change saying why it is not in the diff."""
    p = patch_mod.make(source, path=path, line=line, settings=settings, current=current, display=_display(path),
                       fix=fix)
    kind = settings.get(FIX)
    missed = next((c for c in p.changes if kind is not None and c.setting == kind), None)
    rest = {k: v for k, v in settings.items() if k != FIX}
    if missed is None or missed.how != "not applied" or not rest:
        return p
    p = patch_mod.make(source, path=path, line=line, settings=rest, current=current, display=_display(path))
    why = dataclasses.replace(missed, text=f"{FIX_WORDS[kind]} is not in the diff: {missed.text}")
    return dataclasses.replace(p, changes=p.changes + (why,))


def _display(path: str) -> str:
    """The path as the diff names it: relative to the working directory where the file
    is under it, else its name (git apply and patch -p1 then run in its directory:
    `apply_in`)."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else os.path.basename(path)


def _installed(path: str) -> bool:
    """Is `path` in the standard library or an installed package (not the user's code)?"""
    import sysconfig

    roots = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = os.path.realpath(path)
    return any(real.startswith(r + os.sep) for r in roots) or f"{os.sep}site-packages{os.sep}" in real


# --------------------------------------------------------------------------------------
# Checked after the change
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """The script as run: its path (None with -m), module, arguments."""

    script: Optional[str]
    module: Optional[str]
    args: tuple


def why_not_checked(m: Measurements, target: Target) -> Optional[str]:
    """Why the change cannot be checked by running the script with it, or None."""
    t = m.tune
    p = patch_mod.Patch.from_dict(t.patch) if t is not None and t.patch else None
    if p is None:
        return "the search found nothing that beats your settings beyond the noise, so there is no change to check"
    if p.reason or p.empty:
        return p.reason or "the change has nothing the script can be run with"
    if any(c.how == "not applied" and c.setting not in WRITTEN for c in p.changes):
        return "part of the change is not applied to the script (see above): the script with the rest would not " \
               "be what the search measured"
    path, _ = created_at(m)
    if p.diff and (target.script is None or os.path.abspath(target.script) != os.path.abspath(path or "")):
        return (f"the loader is created in {path}, not in the script run ({target.script or target.module}): only a "
                "change to the script itself is run from a copy; apply the diff and compare two runs")
    return None


def check(m: Measurements, target: Target, *, end: Optional[float] = None, seconds: Optional[float] = None,
          clock: Callable[[], float] = time.perf_counter, emit: Callable[[str], None] = lambda s: None,
          run: Optional[Callable] = None) -> Measurements:
    """The measurements with the tune section's `applied` (the patched script's own run,
    see the module's docstring) or `applied_reason`. The run ends by `end` (on `clock`:
    the end of --max-seconds), measuring the time left less the script's start-up (the
    run's `startup_s`) and PATCH_RUN_MARGIN_S; a run still going then is stopped
    (run_once). A second run only where the first gave fewer than two visits (its
    speed has no spread to agree within) and the time holds one. `seconds`: each run
    measures this long, whatever the time (tests); `run(command, env)`: (windows,
    loader, error) in place of a process (tests). The time it took is the budget's
    `spent` patching."""
    t = m.tune
    why = why_not_checked(m, target)
    if why is None and seconds is None:
        why, seconds, n = fit_runs(m, None if end is None else end - clock())
    else:
        n = PATCH_RUNS
    if why is not None:
        return dataclasses.replace(m, tune=dataclasses.replace(t, applied_reason=why))
    p = patch_mod.Patch.from_dict(t.patch)
    settings = dict(settings_to_write(m, kinds_of(t.patch)) or {})
    start = clock()
    runs: list = []
    loaders: list = []
    error = None
    with _patched_copy(target, p) as copy:
        for i in range(2):
            emit(f"checking the change: your script with it ({i + 1} of {n})" if i < n else
                 "checking the change: your script with it once more (the first run's speed has no spread)")
            if i and end is not None:  # the second run measures what is left
                seconds = max(PATCH_RUN_LEAST_S, round(end - clock() - (m.run.startup_s or 0.0) - PATCH_RUN_MARGIN_S, 1))
            command, env = _command(target, p, copy, seconds)
            if run is not None:
                windows, loader, error = run(command, env)
            else:
                limit = None if end is None else max(1.0, end - clock())
                windows, loader, error = run_once(command, env, limit)
            error = error or built_without(settings, loader)
            if error is not None:
                error = f"the patched script: {error}"
                break
            runs.append(windows)
            loaders.append(loader)
            if i + 1 >= n and (len(_rounds(runs)) >= 2 or end is None or not _fits_another(m, end - clock())):
                break
    pauses = [loader.get("epoch_ms_per_batch") for loader in loaders if loader] if error is None else []
    applied = Trial("applied", settings, (), _dump(runs), error,
                    epoch_ms_per_batch=max((p for p in pauses if p is not None), default=None))
    out = dataclasses.replace(m, tune=dataclasses.replace(t, applied=applied))
    spent = {**((m.run.budget or {}).get("spent") or {}), "patching": round(clock() - start, 3)}
    if m.run.budget:
        out = dataclasses.replace(out, run=dataclasses.replace(m.run, budget={**m.run.budget, "spent": spent}))
    return out


def built_without(settings: dict, loader: Optional[dict]) -> Optional[str]:
    """Why the patched script's loader is not the change (its run's `loader` settings,
    where it says them: None where they match, or nothing was said)."""
    if not loader:
        return None
    wrong = [f"{k}={loader.get(k)!r}, not {v!r}" for k, v in settings.items()
             if k in patch_mod.LOADER_KEYS and k in loader and loader.get(k) != v]
    return ("it built its loader with " + ", ".join(wrong) + ": the change did not reach the loader it trains on"
            if wrong else None)


def _rounds(runs: list) -> set:
    """The visits of the runs' full point (one a round; a window without its round: its own)."""
    return {v.visit for v in _dump(runs)}


def _fits_another(m: Measurements, left: float) -> bool:
    return left - (m.run.startup_s or 0.0) - PATCH_RUN_MARGIN_S >= PATCH_RUN_LEAST_S


def fit_runs(m: Measurements, left: Optional[float]) -> tuple[Optional[str], float, int]:
    """(why not, seconds each run measures, runs) for the change's check in `left`
    seconds: the runs the budget planned (plan.plan_budget: PATCH_RUNS), each measuring
    its share less the script's start-up and PATCH_RUN_MARGIN_S, at least
    PATCH_RUN_LEAST_S."""
    budget = m.run.budget or {}
    if budget.get("patch_reason"):
        return f"out of time: {budget['patch_reason']}", 0.0, 0
    if left is None:
        return "out of time: no time was kept for it", 0.0, 0
    overhead = (m.run.startup_s or 0.0) + PATCH_RUN_MARGIN_S
    n = max(1, int(budget.get("patch_runs") or PATCH_RUNS))
    seconds = left / n - overhead
    if seconds >= PATCH_RUN_LEAST_S:
        return None, round(seconds, 1), n
    return (f"out of time: {max(0.0, left):.0f} s of --max-seconds were left for it, less than "
            f"{'a run' if n == 1 else f'{n} runs'} of your script need{'s' if n == 1 else ''} (about {overhead:.0f} s "
            f"to start, then {PATCH_RUN_LEAST_S:g} s measuring); raise --max-seconds"), 0.0, 0


class _patched_copy:
    """The script with the diff applied, in a temporary copy beside it (None without a
    diff); removed on leaving."""

    def __init__(self, target: Target, p: patch_mod.Patch) -> None:
        self.target, self.p, self.path = target, p, None

    def __enter__(self) -> Optional[str]:
        if not self.p.diff:
            return None
        script = os.path.abspath(self.target.script)
        with open(script, encoding="utf-8", errors="surrogateescape") as fh:
            source = fh.read()
        text = edits.applied(source, self.p.diff)
        stem, ext = os.path.splitext(os.path.basename(script))
        fd, self.path = tempfile.mkstemp(prefix=f"{stem}{COPY_SUFFIX}_", suffix=ext, dir=os.path.dirname(script))
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
        return self.path

    def __exit__(self, *exc) -> None:
        if self.path is not None and os.path.exists(self.path):
            os.remove(self.path)


def _command(target: Target, p: patch_mod.Patch, copy: Optional[str], seconds: float) -> tuple[list, dict]:
    """The command line and environment of the check's run: the tool's `run --points
    full` of the script as the user ran it with the change: its patched copy (where the
    change has a diff), the change's flags on its command line and variables in its
    environment.
    The allocator is held still there as the search held it in this process, so that the
    patched script's speed is read as the search's figure was."""
    env = dict(os.environ)
    base = [sys.executable, "-m", "bisect_pipeline", "run", "--points", "full", "--verify-seconds", "0",
            "--max-seconds", f"{seconds:g}", "--quiet", "--json", "{json}"]
    script = [copy] if copy else [target.script] if target.script else ["-m", target.module]
    env.update({k: str(v) for k, v in (p.env or {}).items()})
    return base + script + patch_mod.with_flags(["script", *target.args], p.changes)[1:], env


def run_once(command: list, env: dict, limit: Optional[float] = None) -> tuple[list, Optional[dict], Optional[str]]:
    """One run: the windows of its full point and the loader settings it measured, or the
    error that left none. Past `limit`
    seconds it is sent SIGTERM (it writes its partial report: the windows measured so far
    count) and killed TERM_GRACE_S later."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [out if c == "{json}" else c for c in command]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stopped = False
        try:
            _, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            stopped = True
            proc.send_signal(signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        if not os.path.exists(out):
            why = f"stopped at the end of its share of --max-seconds ({limit:.0f} s)" if stopped else \
                f"exit {proc.returncode}"
            return [], None, f"{why}: {(stderr or '').strip()[-300:]}"
        with open(out) as fh:
            doc = json.load(fh)
    full = next((p for p in doc.get("points", ()) if p.get("point") == "full"), {})
    # one window is a run's time per batch (its visit's, outcome.compared pairs the runs);
    # none is a run out of time, not a failure of the script: its place stays empty
    windows = full.get("windows") or []
    # the loader's settings as the run measured them, with the pause at each epoch's start
    # its windows leave out (read beside the search's figure, whose windows hold it)
    pause = ((doc.get("run") or {}).get("epoch_start") or {}).get("ms_per_batch")
    return windows, dict(doc.get("loader") or {}, epoch_ms_per_batch=pause), None


def _dump(runs: list) -> tuple:
    """The runs' windows, each with its visit: its round in its run (a visit of `full` a
    round), the runs' rounds numbered on."""
    out: list = []
    for ws in runs:
        base = 1 + max((w.visit for w in out), default=-1)
        out += [VisitWindow(int(w["steps"]), float(w["seconds"]), base + int(w.get("round", k)))
                for k, w in enumerate(ws)]
    return tuple(out)
