"""Advice rules for the loader's workers: how many (num_workers, or a node graph's Mappers),
whether the cores can supply them, and keeping them across epochs (persistent_workers).
Separate from the stages' own rules: these spread the worker-side work, not cheapen it."""

from __future__ import annotations

import math
from typing import Optional

from ..core.stats import is_real
from ..derive.findings import Finding
from ..derive.witness import waits
from ..measure.plan import EPOCH_WINDOW_S
from .context import MIN_ACTIONABLE_SHARE, Context, headroom, headroom_text, rounded, sec_per_batch
from .wording import finding, settings_action


WORKER_STAGES = ("load", "augment", "collate")
# A worker stage that waits more than it computes (witness.waits: a network file system,
# an object store, a database read) has workers that overlap their waits, so they scale
# past the cores (users of such loaders run 16-32 workers on 8 cores): the advice and
# the search (tune.py) go up to this many times the cores, as far as the isolated costs
# say would feed the step.
WAITING_CORES_FACTOR = 4
# In a user's loop the check's windows end before each of the loop's epoch ends (visit.py),
# so a cost paid once per epoch cannot be measured there.
LOOP_EPOCHS = ("the check cannot measure it in your own loop: the loop's epoch ends are pauses it leaves out of its "
               "windows, and the workers start again in them; check it with --entry, or with compare (a run before "
               "and after)")


def _workers_needed(c: Context) -> Optional[dict]:
    """Workers that would feed the step: from the isolated costs when measured, else from
    the bisection (with num_workers=0 a stage's drop is its serial cost per batch)."""
    w = c.part("workers")
    if w is not None and w.needed:
        return {"needed": int(w.needed), "worker_ms_per_batch": w.worker_ms_per_batch,
                "step_ms_per_batch": w.step_ms_per_batch, "cores": int(w.cores), "available": int(w.available),
                "step_threads": int(w.step_threads or 0), "source": "isolated costs"}
    if c.workers != 0 or c.t_ceiling is None:
        return None
    work = sum(max(0.0, c.stage_ms(s) or 0.0) for s in WORKER_STAGES)
    step_ms = c.t_ceiling * 1e3
    cores = int(c.r.run.cpu_count or 1)
    return {"needed": max(1, math.ceil(work / step_ms)), "worker_ms_per_batch": rounded(work), "step_ms_per_batch": rounded(step_ms),
            "cores": cores, "available": max(0, cores - 1), "source": "bisection stage costs (num_workers=0)"}


def _worker_side(c: Context) -> Optional[tuple]:
    """(stage, ms per batch, label) of the work num_workers parallelizes, when it is a
    real cost: the bottleneck when it is load, augment or collate; or, when the verdict is
    a tie between stages, the whole drop from `full` to the first point below
    collate (load + augment + collate together) when that drop is above the noise by the
    verdict's own rule (stats.is_real against t(full))."""
    if c.b in WORKER_STAGES and c.significant(c.b):
        return c.b, c.cost_ms(c.b), c.b
    if c.b != "tie":
        return None
    full = c.r.throughput("full")
    name = next((p for p in ("collated", "host", "device") if c.r.throughput(p) is not None), None)
    if full is None or name is None:
        return None
    drop = c.t_full - sec_per_batch(c.r, name)
    sigma = c.r.drop_sigma(name, "full")
    if sigma is None or not is_real(drop, sigma, c.t_full):
        return None
    costed = [(c.stage_ms(s) or 0.0, s) for s in WORKER_STAGES if c.stage(s) is not None and c.stage(s).status == "ok"]
    if not costed:
        return None
    top = max(costed)[1]
    parts = [s for _, s in sorted(costed, reverse=True) if (c.stage_ms(s) or 0) > 0] or [top]
    return top, drop * 1e3, " + ".join(parts) + " together"


def workers(c: Context):
    """num_workers too low for a load/augment/collate bottleneck -> the count that feeds the step."""
    side = _worker_side(c)
    if side is None:
        return None
    stage, ms, label = side
    need = _workers_needed(c)
    if need is None or (c.nodes and _elsewhere(c, stage)):  # (a node graph's other Mappers: graph_mappers)
        return None
    n, avail, cores = need["needed"], need["available"], need["cores"]
    wait = waits(c.r.isolated)  # workers that wait overlap their waits, a core each or not: past the cores
    avail = cores * WAITING_CORES_FACTOR if wait else avail
    if label == stage:
        head = headroom(c, stage)
    else:  # the worker side together: t(full) without its drop, never above the ceiling
        full_sps = c.r.batch_size / c.t_full
        free = c.r.batch_size / max(c.t_full - ms / 1e3, c.t_ceiling or 0.0)
        head = {"samples_per_sec": rounded(full_sps, 1), "samples_per_sec_if_free": rounded(free, 1),
                "gain_if_free": rounded(free / full_sps - 1, 4)}
    numbers = {"num_workers": c.workers, "stage_ms_per_batch": rounded(ms), "stages": label, **need, "headroom": head,
               **({"waits": wait} if wait else {})}
    if c.nodes:
        numbers["node_graph"] = c.lo.get("main_mapper") or True
    on_cpu = " On the CPU the step itself uses these cores too, so workers and step compete." if not c.cuda else ""
    alone = (f"Alone, the work the workers would do (load + augment + collate) costs "
             f"{need['worker_ms_per_batch']:.1f} ms per batch against a {need['step_ms_per_batch']:.1f} ms step")
    if n > avail and c.workers >= avail:
        return _cores(c, (stage, label), need, numbers, on_cpu)
    recommended = max(1, min(n, avail)) if avail else 1
    if c.workers >= recommended:
        return None
    numbers["recommended"] = {"num_workers": recommended}
    threads = need.get("step_threads") or 0
    check = None
    if not c.cuda and threads + recommended > cores and not wait:
        # A CPU step already runs on every core (torch.get_num_threads()): a worker added
        # on top oversubscribes them and can make the run slower; hand it a core instead.
        numbers["recommended"]["torch_num_threads"] = max(1, cores - recommended)
        on_cpu = (f" The step runs on the CPU with torch.get_num_threads()={threads} on {cores} cores, so a worker "
                  f"added on top would compete with it: hence torch.set_num_threads("
                  f"{numbers['recommended']['torch_num_threads']}) in the training process.")
        check = None if c.nodes else f"Check the gain with --sweep num_workers={c.workers},{recommended}."
    keep = ""
    if not c.lo.get("persistent_workers") and not c.nodes:  # (a node graph's threads start every epoch: no setting)
        # workers that are not persistent are forked again every epoch, a cost the loop pays
        numbers["recommended"]["persistent_workers"] = True
        keep = " Without persistent_workers=True they would start again every epoch."
    keep += _rebuilt_text(c)
    one = label == stage
    where = ((("runs" if one else "run") + " in the training loop's own process") if c.workers == 0
             else ("is" if one else "are") + f" spread over only {c.workers} worker(s)")
    if c.nodes:
        where += f" ({_graph_text(c.lo)})"
    fit = _fit(n, (avail, cores), recommended, label, wait)
    # the bottleneck's headroom is the verdict's own figure (the report's summary says it)
    free = "" if one and stage == c.b else headroom_text(head, stage if one else "that work")
    return finding("num_workers", stage, "Set " + settings_action(numbers["recommended"], c.nodes), (
        f"With {c.num_workers}={c.workers}, {label}{'' if one and stage == c.b else f' ({ms:.1f} ms per batch)'} {where}. "
        f"{alone}: {fit}.{keep}"
        + free + on_cpu), numbers, check=check)


def _elsewhere(c: Context, stage: str) -> list:
    """On a node graph, the Mappers that run `stage` (and the stages measured with it)
    where the graph's main Mapper, whose num_workers the check and --tune set, is not one
    of them: a `Mapper(augment)` in one thread after a `ParallelMapper(load)`."""
    s = c.stage(stage)
    covers = set(getattr(s, "includes", None) or ()) | {stage}
    own = [m for m in c.lo.get("mappers") or () if m["stage"] in covers]
    return own if own and not any(m["main"] for m in own) else []


def graph_mappers(c: Context):
    """A node graph's named stage runs in Mappers other than its main one: run them in a
    ParallelMapper, or give it more workers (not checked: the check and --tune set the
    main Mapper's workers only)."""
    side = _worker_side(c) if c.nodes else None
    own = _elsewhere(c, side[0]) if side is not None else []
    need = _workers_needed(c) if own else None
    if need is None:
        return None
    stage, ms, label = side
    names = ", ".join(m["node"] for m in own)
    workers = max(m["num_workers"] for m in own)
    serial = not workers
    # its drop is the work of its own threads, one where it is serial
    feed = max(1, math.ceil(ms * max(1, workers) / need["step_ms_per_batch"])) if need["step_ms_per_batch"] else None
    how = ("in one thread: a Mapper runs in the thread of the node that reads it" if serial
           else f"on {workers} worker(s)")
    action = f"Run {names} as a ParallelMapper" if serial else f"Give {names} more workers"
    return finding("num_workers", stage, action, (
        f"{label.capitalize()} runs in {names}, {how}, not in {_graph_text(c.lo)}, whose num_workers the check "
        f"and --tune set. It adds {ms:.1f} ms per batch against a {need['step_ms_per_batch']:.1f} ms step"
        + (f": about {feed} workers would feed the step." if feed else ".")),
        {"num_workers": c.workers, "stage_ms_per_batch": rounded(ms), "stages": label, **need, "node_graph": True,
         "mappers": [m["node"] for m in own]})


def _fit(n: int, machine: tuple, recommended: int, label: str, wait: str) -> str:
    """Whether this machine can supply the `n` workers that would feed the step
    (`machine`: the workers it may run, its cores)."""
    avail, cores = machine
    if n > avail:
        return (f"{n} workers would feed the step but this machine has {cores} cores: {recommended} is the most it "
                f"can supply, so also make the {label} work cheaper")
    if wait:
        return f"{n} worker(s) would feed the step: {wait}, so workers overlap their waits beyond this machine's {cores} cores"
    return f"{n} worker(s) would feed the step and this machine's {cores} cores can supply them"


def _cores(c: Context, side: tuple, need: dict, numbers: dict, on_cpu: str) -> Finding:
    """The workers that would feed the step are more than this machine's cores can run,
    and the loader already uses them: the work itself must get cheaper. `side`: (the
    stage, its label: _worker_side)."""
    stage, label = side
    n, avail, cores = need["needed"], need["available"], need["cores"]
    work = label if label == stage else label.removesuffix(" together")
    free = (f"{c.num_workers}={c.workers} already uses the {avail} core(s) free for them" if avail else
            "no core is free for them")
    return finding("cores", stage, f"Make {work} cheaper", (
        f"Feeding the step takes {need['worker_ms_per_batch']:.1f} ms of worker work per batch against a "
        f"{need['step_ms_per_batch']:.1f} ms step, and this machine has {cores} cores ({avail} for workers)."
        + on_cpu), numbers, figure=f"more workers cannot help: about {n} would feed the step, {free}")


def _graph_text(lo: dict) -> str:
    """The graph's main Mapper, as the reasoning names it."""
    return f"your graph's {lo.get('main_mapper') or 'Mapper'}"


def restart(c: Context):
    """Workers that are not persistent, in short epochs -> persistent_workers=True.

    Each epoch a loop with such workers shuts them down and starts new ones, which build
    their first batches while the loop waits; the bisection's points run one endless
    epoch and never pay it, the advice's check pays it as the loop does (verify.py). Fires
    when an epoch lasts at most EPOCH_WINDOW_S (the check then times whole epochs) and the
    start measured at `full` (its first batch, less one batch's work and the step) spread
    over an epoch is worth acting on (MIN_ACTIONABLE_SHARE of t(full)); the check says
    whether it is a gain."""
    epoch = c.lo.get("batches_per_epoch")
    if c.nodes:  # a node graph's threads start again every epoch: no setting keeps them
        return None
    if not c.workers or c.lo.get("persistent_workers") or not epoch or not c.t_full or epoch * c.t_full > EPOCH_WINDOW_S:
        return None
    full = next((p for p in c.r.points if p.point == "full"), None)
    first = full.first_batch_seconds if full is not None else None
    w = c.part("workers")
    work = w.worker_ms_per_batch / 1e3 if w is not None and w.worker_ms_per_batch else c.workers * c.t_full
    start = (first or 0.0) - work - (c.t_ceiling or 0.0)
    per_batch = start / epoch
    if per_batch < MIN_ACTIONABLE_SHARE * c.t_full:
        return None
    # the points never pay the restart: the loop runs at t(full) plus the restart per batch
    bs, loop = c.r.batch_size, c.t_full + per_batch
    head = {"samples_per_sec": rounded(bs / loop, 1), "samples_per_sec_if_free": rounded(bs / c.t_full, 1),
            "gain_if_free": rounded(loop / c.t_full - 1, 4)}
    numbers = {"num_workers": c.workers, "persistent_workers": False, "batches_per_epoch": epoch,
               "epoch_s": rounded(epoch * c.t_full), "first_batch_s": first, "batch_work_ms": rounded(work * 1e3),
               "start_ms": rounded(start * 1e3), "start_ms_per_batch": rounded(per_batch * 1e3), "headroom": head,
               "recommended": {"persistent_workers": True}}
    if c.r.measurements.mode == "loop":
        numbers["not_checked"] = LOOP_EPOCHS
    return finding("persistent_workers", "epoch", "Set persistent_workers=True", (
        f"With num_workers={c.workers} and persistent_workers=False, the workers are shut down and started again at "
        f"every epoch, every {epoch} batches ({epoch * c.t_full:.2g} s at the full pipeline's {c.t_full * 1e3:.3g} ms a "
        f"batch, which never ends an epoch). Starting them took about {start * 1e3:.0f} ms at the full point (its "
        f"first batch, {first:.2f} s, less one batch's work and the step): about {per_batch * 1e3:.1f} ms more per "
        "batch in a loop that ends its epochs." + _rebuilt_text(c) + headroom_text(head, "the restart")), numbers)


def _rebuilt_text(c: Context) -> str:
    """Where the loop builds its DataLoader anew every epoch (loop.Session._succeed):
    persistent workers die with their loader, so the loader must be built once."""
    src = c.r.measurements.source or {}
    if not src.get("rebuilt"):
        return ""
    return (f" Your script builds this DataLoader anew every epoch (at {src.get('created_at') or 'one line'}): build "
            "it once, before the epoch loop, or its workers start again every epoch whatever persistent_workers says.")

