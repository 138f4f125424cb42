"""What-if sweep: rerun the `full` point under other loader settings.

`--sweep num_workers=0,1,2,4 --sweep pin_memory=0,1` measures the user's pipeline, as
it is, under every combination of the given settings (plus the user's own, the
baseline), and names the fastest. Each row is one visit of the `full` point with the
settings applied to a copy of the `loader.LoaderSpec` (experiment.Experiment.visit, as the
bisection's points), and the user's state is restored afterwards as in `api.bisect`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from .core import tree
from .core.errors import BisectError
from .core.stats import Throughput, compare, unpaired
from .measure import devices
from .measure.experiment import Experiment
from .measure.plan import DEFAULT_MAX_SECONDS, Plan
from .measure.timed import reason_of
from .measure.visit import Visit, drive
from .pipeline import state
from .pipeline import loader as loader_mod
from .pipeline.workload import Workload, validate

SCHEMA_VERSION = 1


# Steady windows kept per row: one visit per combination, so twice a bisection visit's.
ROW_WINDOWS = 6


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use 0/1 or true/false)")


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise ValueError(f"{value} must be >= {least}")
        return value
    return parse


# The settings a sweep can vary, with the parser of their values.
SWEEPABLE = {
    "num_workers": _at_least(0),
    "pin_memory": _bool,
    "prefetch_factor": _at_least(1),
    "persistent_workers": _bool,
    "batch_size": _at_least(1),
    # intra-op threads of the training step (torch.set_num_threads) while the row runs:
    # on the CPU the step and the workers share the same cores
    "torch_threads": _at_least(1),
}


def parse(options: Iterable[str]) -> dict:
    """['num_workers=0,1,2', 'pin_memory=0,1'] -> {'num_workers': [0, 1, 2], 'pin_memory': [False, True]}."""
    grid: dict = {}
    for opt in options:
        name, sep, values = opt.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise BisectError(f"--sweep {opt!r} is not NAME=V1,V2,...; e.g. --sweep num_workers=0,2,4.")
        if name not in SWEEPABLE:
            raise BisectError(f"--sweep: {name!r} cannot be swept; the settings are {', '.join(SWEEPABLE)}.")
        if name in grid:
            raise BisectError(f"--sweep: {name} is given twice; list all its values once: {name}=V1,V2,...")
        try:
            parsed = [SWEEPABLE[name](v) for v in values.split(",") if v.strip()]
        except ValueError as exc:
            raise BisectError(f"--sweep {opt!r}: {exc}.") from None
        grid[name] = list(dict.fromkeys(parsed))  # unique, in the order given
    return grid


def _user_settings(spec: loader_mod.LoaderSpec) -> dict:
    return {"num_workers": spec.num_workers, "pin_memory": spec.pin_memory,
            "prefetch_factor": spec.prefetch_factor, "persistent_workers": spec.persistent_workers,
            "batch_size": spec.batch_size, "torch_threads": torch.get_num_threads()}


def effective(settings: dict) -> dict:
    """Settings as the DataLoader applies them: without workers, prefetch_factor and
    persistent_workers do nothing; with workers and no prefetch_factor, torch uses 2."""
    eff = dict(settings)
    if eff["num_workers"] == 0:
        eff["prefetch_factor"], eff["persistent_workers"] = None, False
    elif eff["prefetch_factor"] is None:
        eff["prefetch_factor"] = 2
    return eff


def combinations(spec: loader_mod.LoaderSpec, grid: dict) -> list:
    """The distinct effective settings to measure, the user's own first (the baseline)."""
    user = _user_settings(spec)
    if "batch_size" in grid and not (spec.batch_size is not None and spec.batch_sampler is None):
        raise BisectError("--sweep batch_size needs a loader built with batch_size=N; this loader uses "
                          + ("its own batch_sampler" if spec.batch_sampler is not None else "batch_size=None")
                          + ", so its batch size cannot be changed here.")
    names = list(grid)
    out = [effective(user)]
    for values in itertools.product(*(grid[n] for n in names)):
        combo = effective({**user, **dict(zip(names, values))})
        if combo not in out:
            out.append(combo)
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    settings: dict
    status: str  # ok | failed | not run
    throughput: Optional[Throughput] = None
    reason: Optional[str] = None
    first_batch_seconds: Optional[float] = None

    @property
    def samples_per_sec(self) -> Optional[float]:
        return self.throughput.samples_per_sec if self.throughput else None


@dataclasses.dataclass(frozen=True)
class SweepResult:
    device: str
    grid: dict
    rows: tuple  # Row, the baseline (user's setting) first
    loader: dict
    run: dict
    interrupted: bool = False

    @property
    def baseline(self) -> Row:
        return self.rows[0]

    def speedup(self, row: Row) -> Optional[float]:
        b = self.baseline
        if row.samples_per_sec is None or b.samples_per_sec is None or b.samples_per_sec <= 0:
            return None
        return row.samples_per_sec / b.samples_per_sec

    def beyond_noise(self, row: Row) -> Optional[bool]:
        """Is the row's change against the baseline real? The tool's one comparison
        (stats.compare) on the two rows' windows, not paired (stats.unpaired: the rows
        were measured one after the other), as compare.py decides a point's change."""
        if self.speedup(row) is None:
            return None
        return compare(unpaired(self.baseline.throughput.times(), row.throughput.times()), 1.0).real

    @property
    def best(self) -> Optional[Row]:
        ok = [r for r in self.rows if r.status == "ok"]
        return max(ok, key=lambda r: r.samples_per_sec) if ok else None

    def varied(self) -> list:
        """The settings shown in the table: those swept, in the order given."""
        return list(self.grid)

    def summary(self) -> str:
        best, base = self.best, self.baseline
        if best is None:
            return "No setting could be measured."
        if base.status != "ok":
            return f"Best: {_fmt_settings(best.settings, self.varied())} at {best.samples_per_sec:,.1f} samples/s " \
                   "(your setting could not be measured to compare with)."
        if best is base or not self.beyond_noise(best) or self.speedup(best) <= 1:
            return (f"Your setting ({_fmt_settings(base.settings, self.varied())}) is the best within noise at "
                    f"{base.samples_per_sec:,.1f} samples/s.")
        return (f"Best: {_fmt_settings(best.settings, self.varied())} at {best.samples_per_sec:,.1f} samples/s, "
                f"{self.speedup(best):.2f}\u00d7 your setting ({_fmt_settings(base.settings, self.varied())}, "
                f"{base.samples_per_sec:,.1f} samples/s).")

    def to_dict(self) -> dict:
        best = self.best
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "bisect-pipeline",
            "kind": "sweep",
            "device": self.device,
            "interrupted": self.interrupted,
            "grid": {k: list(v) for k, v in self.grid.items()},
            "baseline": self.baseline.settings,
            "best": best.settings if best else None,
            "summary": self.summary(),
            "rows": [{
                "settings": r.settings,
                "user_setting": i == 0,
                "status": r.status,
                "reason": r.reason,
                "samples_per_sec": None if r.samples_per_sec is None else round(r.samples_per_sec, 1),
                "rel_spread": None if r.throughput is None else round(r.throughput.rel_iqr, 4),
                "rel_se": None if r.throughput is None else round(r.throughput.rel_se, 4),
                "windows": [{"steps": w.steps, "seconds": round(w.seconds, 6)} for w in r.throughput.windows]
                if r.throughput else [],
                "speedup": None if self.speedup(r) is None else round(self.speedup(r), 4),
                "beyond_noise": self.beyond_noise(r),
                "time_to_first_batch_s": None if r.first_batch_seconds is None else round(r.first_batch_seconds, 4),
            } for i, r in enumerate(self.rows)],
            "loader": self.loader,
            "run": self.run,
        }

    def __str__(self) -> str:
        from tabulate import tabulate

        names = self.varied()
        table = []
        for i, r in enumerate(self.rows):
            sp = self.speedup(r)
            noise = self.beyond_noise(r)
            label = "-" if sp is None else f"{sp:.2f}\u00d7" + ("" if noise or i == 0 else " (noise)")
            table.append([*(_fmt_value(r.settings[n]) for n in names),
                          "-" if r.samples_per_sec is None else f"{r.samples_per_sec:,.1f}",
                          "" if r.throughput is None else f"±{r.throughput.rel_iqr * 100:.1f}%",
                          label,
                          "; ".join(filter(None, [
                              "your setting" if i == 0 else "",
                              "" if r.status == "ok" else f"{r.status}: {r.reason}",
                              "pin_memory has no effect without an accelerator"
                              if r.settings.get("pin_memory") and self.device == "cpu" and "pin_memory" in names else ""]))])
        head = f"bisect-pipeline sweep: device {self.device}, full pipeline under {len(self.rows)} setting(s)"
        text = tabulate(table, headers=[*names, "samples/s", "spread", "vs yours", "note"], disable_numparse=True,
                        colalign=(*("left" for _ in names), "right", "right", "right", "left"))
        return "\n".join([head, "", text, "", self.summary()])


def _fmt_value(v: Any) -> str:
    return "-" if v is None else str(v)


def _fmt_settings(settings: dict, names: list) -> str:
    return ", ".join(f"{n}={_fmt_value(settings[n])}" for n in names)


def run(workload: Workload, grid: dict, *, device: Any = None, max_seconds: float = DEFAULT_MAX_SECONDS,
        plan: Optional[Plan] = None, progress: Optional[Callable[[dict], None]] = None,
        clock: Callable[[], float] = time.perf_counter) -> SweepResult:
    """Measure the full pipeline under each combination of `grid` (see `parse`).

    The user's loader is never iterated; the model, optimizer, RNGs and thread count are
    restored afterwards (state.capture/restore), on success, error or Ctrl-C: a Ctrl-C
    returns the rows measured so far with `interrupted=True`.
    """
    validate(workload, "sweep")
    if not grid:
        raise BisectError("the sweep has no setting to vary; e.g. --sweep num_workers=0,2,4.")
    if not max_seconds or max_seconds <= 0 or not math.isfinite(max_seconds):
        raise BisectError(f"max_seconds must be a finite number > 0, got {max_seconds}.")
    dev = devices.resolve(device)
    spec = loader_mod.describe(workload.loader)
    combos = combinations(spec, grid)
    start = clock()
    exp = Experiment(spec, dev, plan or Plan(), clock, progress or (lambda event: None), None, start=start,
                     end=start + max_seconds, deadline=start + max_seconds)
    rows = Rows(exp, combos, grid)
    interrupted = False
    try:
        with state.preserved(workload.model, workload.optimizer, dev):
            exp.use(workload)
            for visit in rows:
                drive(visit, exp.step if spec.batch_size else _counting(exp.step, rows.sizes))
    except KeyboardInterrupt:
        interrupted = True
    measured = list(rows.rows)
    for settings in combos[len(measured):]:
        measured.append(Row(settings, "not run", reason="interrupted" if interrupted else "out of time"))
    run_info = {"max_seconds": max_seconds, "elapsed_s": round(clock() - start, 3), "torch": torch.__version__,
                "cpu_count": os.cpu_count()}
    return SweepResult(device=str(dev), grid=grid, rows=tuple(measured), loader=spec.settings(), run=run_info,
                       interrupted=interrupted)


class Rows:
    """The sweep as a schedule (as rounds.Rounds): one visit of the full pipeline per
    combination, each an equal share of the time left; `rows` as they are measured."""

    def __init__(self, exp: Experiment, combos: list, grid: dict) -> None:
        self.exp = exp
        self.combos = combos
        self.grid = grid
        self.rows: list = []
        self.sizes: list = []  # samples in the first batch seen (a loader without batch_size)

    def __iter__(self) -> Iterator[Visit]:
        exp = self.exp
        for i, settings in enumerate(self.combos):
            exp.emit({"event": "point", "point": "full " + _fmt_settings(settings, list(self.grid)), "index": i,
                      "total": len(self.combos)})
            deadline = exp.clock() + max(0.0, exp.deadline - exp.clock()) / (len(self.combos) - i)
            spec = exp.spec.with_settings(settings)
            # one endless epoch, as the bisection's points (not verify.py's epochs): a row's
            # windows that span a worker re-fork made the spread +-54% on a 4-batch epoch
            visit = exp.visit("full", deadline, spec=spec, threads=settings.get("torch_threads"), keep=ROW_WINDOWS)
            yield visit
            self.rows.append(self._row(settings, spec, visit))

    def _row(self, settings: dict, spec: loader_mod.LoaderSpec, visit: Visit) -> Row:
        m = visit.measured
        first = None if m.first_batch_seconds is None else m.opened_seconds + m.first_batch_seconds
        if m.error is not None:
            if isinstance(m.error, BisectError):
                raise m.error
            return Row(settings, "failed", reason=reason_of(m.error))
        if not m.windows:
            return Row(settings, "failed", reason="out of time before one window was measured (raise --max-seconds)",
                       first_batch_seconds=first)
        bs = spec.batch_size or (self.sizes[0] if self.sizes else 1)
        return Row(settings, "ok", Throughput(m.windows, bs), first_batch_seconds=first)


def _counting(step: Callable[[Any], Any], sizes: list) -> Callable[[Any], Any]:
    """`step`, noting the samples in the first batch it gets (tree.leading_dim)."""
    def counted(batch: Any) -> Any:
        if not sizes:
            sizes.append(tree.leading_dim(batch) or 1)
        return step(batch)
    return counted


def main(make_workload: Callable[[], Workload], options: Iterable[str], *, json_path: Optional[str], max_seconds: float,
         device: Any, quiet: bool, debug: bool, progress: Optional[Callable[[dict], None]] = None,
         interrupt_code: Callable[[], int] = lambda: 130) -> int:
    """The CLI's `--sweep` run: returns the exit status (0 ok, 1 nothing measured, 2 usage, 130/143 Ctrl-C)."""
    import traceback

    import click

    from .report import write_atomic

    try:
        grid = parse(options)
        result = run(make_workload(), grid, device=device, max_seconds=max_seconds, progress=progress)
    except KeyboardInterrupt:
        click.echo("bisect-pipeline: error: interrupted before anything was measured", err=True)
        return interrupt_code()
    except BisectError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"bisect-pipeline: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"bisect-pipeline: error: the sweep failed: {type(exc).__name__}: {exc} "
                   "(rerun with --debug for the traceback)", err=True)
        return 1
    if progress is not None and hasattr(progress, "done"):
        progress.done()
    if json_path:
        import json

        write_atomic(json_path, json.dumps(result.to_dict(), indent=2) + "\n")
    click.echo(result.summary() if quiet else str(result))
    sys.stdout.flush()
    if result.interrupted:
        return interrupt_code()
    return 0 if result.best is not None else 1
