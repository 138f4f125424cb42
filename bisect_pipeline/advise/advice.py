"""What to change: typed findings from the measured numbers and the loader's settings.

Every rule fires only when its measured condition holds, and every finding carries the
numbers it rests on (`numbers`), so the advice is data first (the JSON's `advice`) and
text second. Nothing here is generic: no number, no finding.

The input is a diagnosis in the making (diagnosis.Diagnosis, before its advice): its
verdict (stage costs from the bisection), `loader` (the user's settings,
`loader.LoaderSpec.settings()`), `isolated` (costs measured alone, in this process:
isolate.py) and `syncs` (host-device syncs in the step, CUDA only).

Why one module: the rules read one context (the diagnosis, read once into `_Context`)
and are ranked against each other (`ranked`); each rule is a short function beside the
constants it rests on, and a split by stage would split that context and the ranking.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..core.results import BatchShape, Collate, Part, SampleStructure
from ..core.stats import MIN_REL_DROP, is_real
from ..derive.findings import Checked, Diagnosis as Report, Finding
from ..derive.verdict import in_question
from ..derive.witness import waits
from ..measure.plan import EPOCH_WINDOW_S
from .outcome import NODE_SETTING, predicted, settings_text
from .outcome import detail as outcome_detail, figure as outcome_figure, sentence as outcome_sentence


# Input-bound class of the whole pipeline, from Verdict.input_bound_fraction: the share
# of the ceiling's throughput lost to input, 1 - full/ceiling = gap / t(full). The
# thresholds are the TensorFlow input-pipeline analyzer's (xprof
# op_stats_to_input_pipeline_analysis.cc): < 5% NOT, 5-20% MODERATELY, >= 20% HIGHLY
# input-bound. 5% is also the verdict's own MIN_REL_DROP. When the verdict is `none` (the
# gap is within noise) the class is `not`, whatever the point estimate.
INPUT_BOUND_MODERATE = 0.05
INPUT_BOUND_HIGH = 0.20

# A measured isolated cost (transfer) is worth acting on from the same share of t(full)
# that makes a bisection drop real (verdict.MIN_REL_DROP).
MIN_ACTIONABLE_SHARE = MIN_REL_DROP
# Peak GPU memory below this share of the device's memory leaves room for a larger batch
# (the seed's example peaks under 1 GB of 16 GB; half the memory is a safe margin for
# activations that grow with the batch).
MEMORY_UNUSED_FRACTION = 0.5
# A custom collate_fn costing this many times default_collate on the same samples does
# work of its own beyond the batch structure.
OWN_COLLATE_WORK_RATIO = 2.0
# The augment finding names the costliest transforms (isolated.augment.breakdown): the
# fewest that make up this share of the parts' sum, at most PARTS_NAMED of them.
PARTS_NAMED_SHARE = 0.5
PARTS_NAMED = 3
# A resize or crop that keeps at most 1 / this of its input's pixels works on images
# larger than the step needs: storing them smaller (or decoding them smaller) saves it.
SHRINK_RATIO = 2.0
# Per-sample structure that makes default_collate slow: Python numbers and lists become
# one tensor per position, numpy arrays are converted one by one, many small tensors are
# stacked one by one.
MANY_NUMBERS = 8
MANY_TENSORS = 8
# Bytes per element saved by sending uint8 instead of a floating dtype.
_FLOAT_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}

WORKER_STAGES = ("load", "augment", "collate")
# Items that blame the batch's payload for a cost of moving it (the restart item ranks
# before them when its measured gain is the bigger: ranked).
PAYLOAD_KINDS = ("uint8_payload", "handoff")
# In a user's loop the check's windows end before each of the loop's epoch ends (visit.py),
# so a cost paid once per epoch cannot be measured there.
LOOP_EPOCHS = ("the check cannot measure it in your own loop: the loop's epoch ends are pauses it leaves out of its "
               "windows, and the workers start again in them; check it with --entry, or with compare (a run before "
               "and after)")


def finding(kind: str, stage: str, action: str, why: str, numbers: dict, *, figure: Optional[str] = None,
            check: Optional[str] = None) -> Finding:
    """A finding whose message is composed from its parts (see Finding)."""
    f = Finding(kind, stage, "", numbers, action=action, figure=figure, why=" ".join(why.split()) or None,
                check=check)
    return dataclasses.replace(f, message=compose(f))


def headline(f: Finding) -> str:
    """The action and its figure, one sentence: 'Set num_workers=1: measured 1.27× (1.12–1.44×).'
    (a finding made without an action: its whole message)."""
    if not f.action:
        return f.message
    fig = (outcome_figure(f.verified) if f.verified is not None and not f.figure else None) or f.figure
    if fig is None and f.verified is None and f.numbers.get("recommended"):
        fig = "not measured"  # settings a check could measure, in a run without one
    return f.action + (f": {fig}." if fig else ".")


def reasoning(f: Finding) -> str:
    """What stands beneath the headline: the reasoning, then what the check measured in
    detail (or how to check it yourself where the tool did not measure it)."""
    if not f.action:
        return ""
    v = f.verified
    detail = outcome_detail(v, bool(f.numbers.get("node_graph"))) if v is not None else ""
    measured = v is not None and v.status not in ("not measured",)
    tail = "" if measured or not f.check else f" {f.check}"
    return " ".join(((f.why or "") + detail + tail).split())


def compose(f: Finding) -> str:
    """The finding as one paragraph (the JSON's `message`): headline, then reasoning."""
    if not f.action:
        return f.message
    return " ".join((headline(f) + " " + reasoning(f)).split())


def checked(f: Finding, v: Checked) -> Finding:
    """The finding with what its check measured (outcome.verified), its message composed
    again; a finding made without an action gets the check's sentence appended."""
    graph = bool(f.numbers.get("node_graph"))
    if not f.action:
        return dataclasses.replace(f, message=f.message + outcome_sentence(v, graph), verified=v)
    recommended = f.numbers.get("recommended") or {}
    action = f.action
    if (v.status == "helps" and v.settings and recommended and action == "Set " + settings_action(recommended, graph)
            and settings_action(v.settings, graph) != settings_action(recommended, graph)):
        action = "Set " + settings_action(v.settings, graph)  # the figure is of the settings that were measured
    g = dataclasses.replace(f, verified=v, action=action)
    return dataclasses.replace(g, message=compose(g))


def input_bound_class(r: "Report") -> Optional[str]:
    """`not`, `moderately`, `highly` input-bound, or None when there is no verdict or
    the run is too noisy to tell (inconclusive, and the gap itself is not real)."""
    v = r.verdict
    if v.bottleneck is None or v.input_bound_fraction is None:
        return None
    if v.bottleneck == "none":
        return "not"
    t_full = v.fitted.get("full")
    if (v.bottleneck == "inconclusive" and v.gap_sigma is not None and t_full
            and not is_real(v.gap_sec_per_batch or 0.0, v.gap_sigma, t_full)):
        return None
    f = v.input_bound_fraction
    if f < INPUT_BOUND_MODERATE:
        return "not"
    if f < INPUT_BOUND_HIGH:
        return "moderately"
    return "highly"


def findings(r: "Report") -> list:
    """Every rule whose measured condition holds, in the report's order."""
    ctx = _Context(r)
    out: list = []
    for rule in (_workers, _graph_mappers, _pin_memory, _restart, _uint8_payload, _collate, _storage, _augment, _reorder, _handoff,
                 _batch_size, _syncs, _allocator):
        found = rule(ctx)
        if found:
            out.extend(found if isinstance(found, list) else [found])
    return out


# --------------------------------------------------------------------------------------


class _Context:
    """The measured numbers the rules read, with their absence made explicit."""

    def __init__(self, r: "Report") -> None:
        self.r = r
        self.b = r.verdict.bottleneck
        self.lo = r.loader or {}
        self.workers = int(self.lo.get("num_workers") or 0)
        self.nodes = is_graph(self.lo)
        # how the advice names the worker count: DataLoader's, or the node graph's main Mapper's
        self.num_workers = "the ParallelMapper's num_workers" if self.nodes else "num_workers"
        self.cuda = str(r.device).startswith("cuda")
        self.t_full = _sec_per_batch(r, "full")
        self.t_ceiling = _ceiling(r)

    def stage(self, name: str):
        try:
            return self.r.stage(name)
        except KeyError:
            return None

    def significant(self, name: str) -> bool:
        """A stage cost to act on: real by the rounds, or named (or tied) on the stages'
        costs alone where the rounds could not tell (verdict.Verdict.witness)."""
        s = self.stage(name)
        if s is None or s.status != "ok":
            return False
        v = self.r.verdict
        return s.significant or (v.witness == "isolated costs" and name in in_question(v))

    def stage_ms(self, name: str) -> Optional[float]:
        s = self.stage(name)
        return None if s is None or s.sec_per_batch is None else s.sec_per_batch * 1e3

    def part(self, name: str) -> Optional[Part]:
        """The isolated measurement `name` (isolate.py) when it was made, else None."""
        return self.r.isolated.part(name) if self.r.isolated is not None else None


def _sec_per_batch(r: "Report", point: str) -> Optional[float]:
    """The point's time per batch as the report shows it (Report.rate)."""
    rate = r.rate(point)
    return r.batch_size / rate if rate else None


def _ceiling(r: "Report") -> Optional[float]:
    if r.verdict.ceiling and r.verdict.ceiling in r.verdict.fitted:
        return r.verdict.fitted[r.verdict.ceiling]
    for name in ("device", "host", "collated", "augmented", "raw"):
        t = _sec_per_batch(r, name)
        if t is not None:
            return t
    return None


def _r(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def headroom(r: "Report", stage: str) -> dict:
    """If `stage` were free: the bisection's samples/s and the gain over the full
    pipeline (0.33 = +33%), or {} when the stage was not costed."""
    c = r if isinstance(r, _Context) else _Context(r)
    s = c.stage(stage)
    if s is None or s.status != "ok" or s.samples_per_sec_if_free is None or not c.t_full:
        return {}
    full = c.r.batch_size / c.t_full
    return {"samples_per_sec": _r(full, 1), "samples_per_sec_if_free": _r(s.samples_per_sec_if_free, 1),
            "gain_if_free": _r(s.samples_per_sec_if_free / full - 1, 4)}


def _headroom_text(h: dict, stage: str) -> str:
    if not h:
        return ""
    return (f" If {stage} were free: {h['samples_per_sec_if_free']:,.0f} samples/s instead of {h['samples_per_sec']:,.0f} "
            f"({h['gain_if_free'] * 100:+.0f}%).")


def _workers_needed(c: _Context) -> Optional[dict]:
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
    return {"needed": max(1, math.ceil(work / step_ms)), "worker_ms_per_batch": _r(work), "step_ms_per_batch": _r(step_ms),
            "cores": cores, "available": max(0, cores - 1), "source": "bisection stage costs (num_workers=0)"}


def _worker_side(c: _Context) -> Optional[tuple]:
    """(stage, ms per batch, label) of the work num_workers parallelizes, when it is a
    real cost: the bottleneck when it is load, augment or collate; or, when the verdict is
    a tie between stages, the whole drop from `full` to the first point below
    collate (load + augment + collate together) when that drop is above the noise by the
    verdict's own rule (stats.is_real against t(full))."""
    if c.b in WORKER_STAGES and c.significant(c.b):
        return c.b, c.stage_ms(c.b), c.b
    if c.b != "tie":
        return None
    full = c.r.throughput("full")
    name = next((p for p in ("collated", "host", "device") if c.r.throughput(p) is not None), None)
    if full is None or name is None:
        return None
    drop = c.t_full - _sec_per_batch(c.r, name)
    sigma = c.r.drop_sigma(name, "full")
    if sigma is None or not is_real(drop, sigma, c.t_full):
        return None
    costed = [(c.stage_ms(s) or 0.0, s) for s in WORKER_STAGES if c.stage(s) is not None and c.stage(s).status == "ok"]
    if not costed:
        return None
    top = max(costed)[1]
    parts = [s for _, s in sorted(costed, reverse=True) if (c.stage_ms(s) or 0) > 0] or [top]
    return top, drop * 1e3, " + ".join(parts) + " together"


def _workers(c: _Context):
    """num_workers too low for a load/augment/collate bottleneck -> the count that feeds the step."""
    side = _worker_side(c)
    if side is None:
        return None
    stage, ms, label = side
    need = _workers_needed(c)
    if need is None or (c.nodes and _elsewhere(c, stage)):  # (a node graph's other Mappers: _graph_mappers)
        return None
    n, avail, cores = need["needed"], need["available"], need["cores"]
    wait = waits(c.r.isolated)  # workers that wait overlap their waits, a core each or not: past the cores
    avail = cores * WAITING_CORES_FACTOR if wait else avail
    if label == stage:
        head = headroom(c, stage)
    else:  # the worker side together: t(full) without its drop, never above the ceiling
        full_sps = c.r.batch_size / c.t_full
        free = c.r.batch_size / max(c.t_full - ms / 1e3, c.t_ceiling or 0.0)
        head = {"samples_per_sec": _r(full_sps, 1), "samples_per_sec_if_free": _r(free, 1),
                "gain_if_free": _r(free / full_sps - 1, 4)}
    numbers = {"num_workers": c.workers, "stage_ms_per_batch": _r(ms), "stages": label, **need, "headroom": head,
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
    free = "" if one and stage == c.b else _headroom_text(head, stage if one else "that work")
    return finding("num_workers", stage, "Set " + settings_action(numbers["recommended"], c.nodes), (
        f"With {c.num_workers}={c.workers}, {label}{'' if one and stage == c.b else f' ({ms:.1f} ms per batch)'} {where}. "
        f"{alone}: {fit}.{keep}"
        + free + on_cpu), numbers, check=check)


def _elsewhere(c: _Context, stage: str) -> list:
    """On a node graph, the Mappers that run `stage` (and the stages measured with it)
    where the graph's main Mapper, whose num_workers the check and --tune set, is not one
    of them: a `Mapper(augment)` in one thread after a `ParallelMapper(load)`."""
    s = c.stage(stage)
    covers = set(getattr(s, "includes", None) or ()) | {stage}
    own = [m for m in c.lo.get("mappers") or () if m["stage"] in covers]
    return own if own and not any(m["main"] for m in own) else []


def _graph_mappers(c: _Context):
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
        {"num_workers": c.workers, "stage_ms_per_batch": _r(ms), "stages": label, **need, "node_graph": True,
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


def _cores(c: _Context, side: tuple, need: dict, numbers: dict, on_cpu: str) -> Finding:
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


def settings_action(recommended: dict, graph: bool = False) -> str:
    """The settings to change as the advice's action says them: 'num_workers=1,
    persistent_workers=True, torch.set_num_threads(1)'; for a torchdata.nodes graph
    (`graph`), on the nodes that hold them: 'ParallelMapper(num_workers=4)'."""
    if graph:
        return settings_text({k: v for k, v in recommended.items() if k in NODE_SETTING or k == "torch_num_threads"},
                             graph=True)
    parts = [f"{k}={v}" for k, v in recommended.items() if k not in ("torch_num_threads", "non_blocking", "env")]
    if "torch_num_threads" in recommended:
        parts.append(f"torch.set_num_threads({recommended['torch_num_threads']})")
    return ", ".join(parts)


# A worker stage that waits more than it computes (witness.waits: a network file system,
# an object store, a database read) has workers that overlap their waits, so they scale
# past the cores (users of such loaders run 16-32 workers on 8 cores): the advice and
# the search (tune.py) go up to this many times the cores, as far as the isolated costs
# say would feed the step.
WAITING_CORES_FACTOR = 4
NODES_KIND = "torchdata.nodes"  # LoaderSpec.settings()["kind"] of a torchdata.nodes graph


def is_graph(loader: Optional[dict]) -> bool:
    """Whether the loader settings (LoaderSpec.settings) are a torchdata.nodes graph's."""
    return (loader or {}).get("kind") == NODES_KIND


def _graph_text(lo: dict) -> str:
    """The graph's main Mapper, as the reasoning names it."""
    return f"your graph's {lo.get('main_mapper') or 'Mapper'}"


def _restart(c: _Context):
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
    head = {"samples_per_sec": _r(bs / loop, 1), "samples_per_sec_if_free": _r(bs / c.t_full, 1),
            "gain_if_free": _r(loop / c.t_full - 1, 4)}
    numbers = {"num_workers": c.workers, "persistent_workers": False, "batches_per_epoch": epoch,
               "epoch_s": _r(epoch * c.t_full), "first_batch_s": first, "batch_work_ms": _r(work * 1e3),
               "start_ms": _r(start * 1e3), "start_ms_per_batch": _r(per_batch * 1e3), "headroom": head,
               "recommended": {"persistent_workers": True}}
    if c.r.measurements.mode == "loop":
        numbers["not_checked"] = LOOP_EPOCHS
    return finding("persistent_workers", "epoch", "Set persistent_workers=True", (
        f"With num_workers={c.workers} and persistent_workers=False, the workers are shut down and started again at "
        f"every epoch, every {epoch} batches ({epoch * c.t_full:.2g} s at the full pipeline's {c.t_full * 1e3:.3g} ms a "
        f"batch, which never ends an epoch). Starting them took about {start * 1e3:.0f} ms at the full point (its "
        f"first batch, {first:.2f} s, less one batch's work and the step): about {per_batch * 1e3:.1f} ms more per "
        "batch in a loop that ends its epochs." + _rebuilt_text(c) + _headroom_text(head, "the restart")), numbers)


def _rebuilt_text(c: _Context) -> str:
    """Where the loop builds its DataLoader anew every epoch (loop.Session._succeed):
    persistent workers die with their loader, so the loader must be built once."""
    src = c.r.measurements.source or {}
    if not src.get("rebuilt"):
        return ""
    return (f" Your script builds this DataLoader anew every epoch (at {src.get('created_at') or 'one line'}): build "
            "it once, before the epoch loop, or its workers start again every epoch whatever persistent_workers says.")


def ranked(advice: tuple) -> tuple:
    """The advice in the report's order, but the restart item (persistent_workers) before
    the payload items when its measured gain is the bigger: its check's speed-up against
    theirs (measured when checked, else the gain if their stage were free, which no payload
    change can beat); after them otherwise."""
    restart = next((f for f in advice if f.kind == "persistent_workers"), None)
    payload = [f for f in advice if f.kind in PAYLOAD_KINDS]
    if restart is None or not payload:
        return advice
    mine = restart.verified.speedup if restart.verified is not None and restart.verified.status == "helps" else None
    theirs = max(_gain(f) for f in payload)
    rest = [f for f in advice if f is not restart]
    at = rest.index(payload[0]) if mine is not None and mine >= theirs else rest.index(payload[-1]) + 1
    return tuple(rest[:at] + [restart] + rest[at:])


def _gain(f: Finding) -> float:
    v = f.verified
    if v is not None and v.status == "helps" and v.speedup:
        return v.speedup
    return predicted(f) or 1.0


def _transfer_ms(c: _Context) -> tuple[Optional[float], str]:
    """The transfer cost worth acting on: the bisection's when significant, else the
    isolated one when it is at least MIN_ACTIONABLE_SHARE of t(full)."""
    if c.significant("transfer"):
        return c.stage_ms("transfer"), "bisection (host -> device points)"
    t = c.part("transfer")
    if t is not None and t.ms_per_batch is not None and c.t_full and t.ms_per_batch / 1e3 >= MIN_ACTIONABLE_SHARE * c.t_full:
        return t.ms_per_batch, "isolated copy"
    return None, ""


def _pin_memory(c: _Context):
    """pin_memory=False with a measured transfer cost -> pin and copy non_blocking."""
    if not c.cuda or c.lo.get("pin_memory"):
        return None
    ms, source = _transfer_ms(c)
    if ms is None:
        return None
    t = c.part("transfer")
    gbs = t.gb_per_s if t is not None else None
    nbytes = t.bytes_per_batch if t is not None else None
    bw = f" at {gbs:.1f} GB/s" if gbs else ""
    size = f" ({nbytes / 2**20:.1f} MB)" if nbytes else ""
    head = headroom(c, "transfer")
    free = "" if c.b == "transfer" else _headroom_text(head, "transfer")  # the verdict's own figure: said once
    pin = "Add a PinMemory node after the Batcher" if c.nodes else "Set pin_memory=True"
    return finding("pin_memory", "transfer", pin + " and move batches with .to(device, non_blocking=True)", (
        f"The host-to-device copy of each batch{size} costs {ms:.1f} ms{bw} with pin_memory=False: pageable memory "
        "is copied through a staging buffer and the copy blocks the step; pinned, it overlaps compute." + free),
        {"transfer_ms_per_batch": _r(ms), "source": source, "gb_per_s": gbs,
         "bytes_per_batch": nbytes, "pin_memory": False, "headroom": head,
         "recommended": {"pin_memory": True, "non_blocking": True}})


def _uint8_payload(c: _Context):
    """Floating-point images crossing the bus (or the worker handoff) with a measured
    cost there -> send uint8 and convert/normalize on the device."""
    batch = c.part("batch")
    images = [t for t in (batch.tensors or () if batch is not None else ()) if t.image and t.dtype in _FLOAT_BYTES
              and _FLOAT_BYTES[t.dtype] > 1]
    if not images:
        return None
    ms, source = _transfer_ms(c) if c.cuda else (None, "")
    stage = "transfer"
    if ms is None and c.significant("handoff"):
        ms, source, stage = c.stage_ms("handoff"), "bisection (collated -> host points)", "handoff"
    if ms is None:
        return None
    head = headroom(c, stage)  # the most a smaller payload can give: the stage free
    img = max(images, key=lambda t: t.bytes)
    factor = _FLOAT_BYTES[img.dtype]
    saved = img.bytes - img.bytes // factor
    shape = list(img.shape)
    where = "the host-to-device copy" if stage == "transfer" else "the hand-off from workers to the loop"
    return finding("uint8_payload", stage, "Keep images uint8 through the loader; convert and normalize them on the "
                   "device inside the step", (
                       f"{img.path} is a {img.dtype} image batch {shape} ({img.bytes / 2**20:.1f} MB) and {where} "
                       f"costs {ms:.1f} ms per batch. Drop ToTensor/Normalize from the transforms (PILToTensor "
                       "instead)."),
        {"tensor": img.path, "dtype": img.dtype, "shape": shape, "bytes": img.bytes,
         "bytes_saved": saved, "stage_ms_per_batch": _r(ms), "source": source, "headroom": head},
                   figure=f"{factor}x less payload ({saved / 2**20:.1f} MB less per batch)")


def _collate(c: _Context):
    """A collate bottleneck -> what in the batch structure (or the function) makes it slow."""
    if c.b != "collate" or not c.significant("collate"):
        return None
    ms = c.stage_ms("collate")
    col = c.part("collate") or Collate()
    st = c.part("sample_structure")
    batch = c.part("batch") or BatchShape()
    name = c.lo.get("collate_fn") or col.collate_fn or "collate_fn"
    numbers = {"collate_ms_per_batch": _r(ms), "collate_fn": name,
               "isolated_ms_per_batch": col.ms_per_batch,
               "default_collate_ms_per_batch": col.default_collate_ms_per_batch,
               "sample_structure": {k: v for k, v in st.to_dict().items() if k != "status"} if st else None,
               "batch_tensors": batch.n_tensors, "batch_bytes": batch.bytes}
    causes = []
    own, dflt = col.ms_per_batch, col.default_collate_ms_per_batch
    if own is not None and dflt is not None and own >= OWN_COLLATE_WORK_RATIO * max(dflt, 1e-3):
        numbers["own_work_ms_per_batch"], numbers["stacking_ms_per_batch"] = _r(own - dflt), dflt
        head = (f"{name}'s own work is {own - dflt:.1f} of the {own:.1f} ms per batch it costs alone; stacking "
                f"(torch's default_collate on the same samples) {dflt:.2f}: ")
        if col.mixes:
            numbers["mixes"] = list(col.mixes)
            causes.append(head + f"it mixes the batch ({', '.join(col.mixes)}), work on the whole batch that no "
                          "per-sample transform can take over: run it on the device inside the step (torchvision's "
                          "v2 MixUp and CutMix take a batch of tensors there), or keep it in the collate_fn and let "
                          "workers run it (num_workers > 0)")
        else:
            causes.append(head + "the cost is the function's own work (per-sample Python, padding, copies), not the "
                          "batch structure; vectorize it or move it into the dataset's transforms (in the workers)")
    causes.extend(_structure_causes(st or SampleStructure()))
    if not causes and batch.bytes:
        causes.append(f"the batch is {batch.n_tensors} tensor(s), {batch.bytes / 2**20:.1f} MB: collate "
                      "copies every byte once; shrink the payload (uint8, smaller crops) or build the batch in one "
                      "preallocated tensor")
    if not causes:
        return None
    head = numbers["headroom"] = headroom(c, "collate")
    # its cost and its headroom are the verdict's own figures (collate is the bottleneck): said once, above
    alone = f"{own:.1f} ms per batch alone" if own is not None else None
    return finding("collate", "collate", f"Make {name} cheaper", "; ".join(causes) + ".", numbers, figure=alone)


def _structure_causes(st: SampleStructure) -> list:
    """What in one sample makes default_collate slow (isolate.sample_structure)."""
    causes = []
    if st.numbers >= MANY_NUMBERS or st.longest_list >= MANY_NUMBERS:
        causes.append(f"each sample carries {st.numbers} Python numbers (longest list {st.longest_list}): "
                      "default_collate builds one tensor per position; return one tensor per field from __getitem__")
    if st.ndarrays:
        causes.append(f"each sample carries {st.ndarrays} numpy array(s), converted one by one: return torch "
                      "tensors (torch.from_numpy) from __getitem__")
    if st.tensors >= MANY_TENSORS:
        causes.append(f"each sample carries {st.tensors} separate tensors, stacked one by one: concatenate them "
                      "into fewer, larger tensors")
    if st.images:
        causes.append(f"{st.images} PIL image(s) per sample reach collate_fn: convert to tensors in the transform")
    if st.strings:
        causes.append(f"{st.strings} string(s) per sample are gathered into Python lists: map them to ids in "
                      "the dataset")
    return causes


def _storage(c: _Context):
    """A load bottleneck -> storage, file format, decoding, caching, with its numbers;
    reading or decoding named when load was split (reads.py)."""
    if c.b != "load" or not c.significant("load"):
        return None
    ms = c.stage_ms("load")
    load = c.part("load")
    per_sample = load.ms_per_sample if load is not None else None
    bs = c.r.batch_size
    numbers = {"load_ms_per_batch": _r(ms), "isolated_ms_per_sample": per_sample, "batch_size": bs,
               "dataset": c.lo.get("dataset"), "num_workers": c.workers, "cache": c.r.cache.to_dict() if c.r.cache.batches is not None else None}
    cap = None
    if per_sample:
        items = c.r.isolated.items_per_batch if c.r.isolated is not None else None
        several = bs / items if items else 1.0  # the samples the step gets of each item loaded
        rate = max(1, c.workers) * 1e3 / per_sample * several
        numbers["load_cap_samples_per_sec"] = _r(rate, 1)
        each = f" (each becomes {several:g} samples)" if abs(several - 1) > 1e-9 else ""
        cap = (f"alone a sample takes {per_sample:.2f} ms to load{each}, so {max(1, c.workers)} process(es) cap "
               f"input at {rate:,.0f} samples/s")
    numbers["headroom"] = headroom(c, "load")
    includes = c.stage("load").includes if c.stage("load") else ()
    merged = "Measured together with augment: the transforms could not be split." if "augment" in includes else ""
    split = load.split if load is not None and load.split is not None and load.split.ok else None
    if split is not None:
        numbers["split"] = split.to_dict()
    what = _split_advice(split, per_sample, c.cuda) if split is not None else (
        " Read fewer, larger files (sharded tar/record formats) from local or faster storage, store pre-resized or "
        "cheaper-to-decode data, or cache decoded samples in memory when they fit.")
    # load's cost and headroom are the verdict's own figures (load is the bottleneck): said once, above
    which = {"read": "reading {}'s files", "decode": "decoding {}'s samples"}.get(
        split.bound if split is not None else "", "loading {}'s samples").format(c.lo.get("dataset") or "the dataset")
    return finding("storage", "load", f"Make {which} cheaper", merged + what, numbers, figure=cap)


def size_text(nbytes: float) -> str:
    """'2.0 MB', '150 KB', '512 bytes' (powers of ten, as MB/s is)."""
    if nbytes >= 1e6:
        return f"{nbytes / 1e6:,.1f} MB"
    return f"{nbytes / 1e3:,.0f} KB" if nbytes >= 1e3 else f"{nbytes:.0f} bytes"


def _split_advice(s, per_sample: Optional[float], cuda: bool) -> str:
    """What to attack, reading or decoding, from load's split with its figures."""
    rate = f" at {s.read_mb_per_s:,.1f} MB/s" if s.read_mb_per_s is not None else ""
    size = f"{size_text(s.bytes_per_sample)} in {s.files_per_sample:g} file(s) per sample"
    read = f"reading its files takes {s.read_ms_per_sample:.2f} ms ({size}{rate})"
    decode = f"decoding and the dataset's other work {s.decode_ms_per_sample:.2f} ms"
    of = f" Of a sample's {per_sample:.2f} ms alone," if per_sample else " Of a sample's loading,"
    if s.bound == "read":
        return (f"{of} {read} and {decode}: storage is the larger part. Group small files into shards "
                "(tar/record formats) so that each read is large, read from local or faster storage, store fewer "
                "bytes (pre-resized images), or cache the samples in memory when they fit.")
    gpu = ", on the GPU in the step with device='cuda'" if cuda else ""
    return (f"{of} {decode} and {read}: decoding is the larger part. Decode once at preparation time (store "
            "pre-resized images or decoded uint8 arrays), decode JPEGs at reduced size (PIL Image.draft), or use "
            f"torchvision.io.decode_jpeg{gpu}.")


def _augment(c: _Context):
    """An augment bottleneck -> the transforms found, with their isolated cost, and the
    costliest of them by name (isolated.augment.breakdown) with a remedy where one is
    known for its kind."""
    if c.b != "augment" or not c.significant("augment"):
        return None
    ms = c.stage_ms("augment")
    aug = c.part("augment")
    per_sample = aug.ms_per_sample if aug is not None else None
    found = list(c.r.cache.raw_transforms or ())
    numbers = {"augment_ms_per_batch": _r(ms), "isolated_ms_per_sample": per_sample,
               "transforms": found, "num_workers": c.workers}
    which = ", ".join(found) or ("the graph's Mapper functions" if c.nodes else "the dataset's transforms")
    parts, named = _costliest_parts(aug.breakdown if aug is not None else None)
    if parts:
        numbers["parts"] = parts
    generic = ("" if any(p["remedy"] for p in parts) else
               " Move work that is the same every epoch (decode, resize) to data preparation, crop before expensive "
               "ops, and run tensor transforms batched on the device inside the step.")
    confirmed = _confirmed(aug.breakdown if aug is not None else None)
    if confirmed:
        numbers["confirmed"] = confirmed[0]
    numbers["headroom"] = headroom(c, "augment")
    # augment's cost and headroom are the verdict's own figures, and the costliest transform
    # measured in the pipeline is the breakdown's (confirmed): each said once, elsewhere
    if parts:
        names = [p["name"] for p in parts]
        total = parts[0]["ms_per_sample"] / parts[0]["share"] if parts[0]["share"] else None
        action = f"Make {names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]} cheaper"
        figure = (f"{'it takes' if len(names) == 1 else 'they take'} {sum(p['ms_per_sample'] for p in parts):.2f} of "
                  f"the {total:.2f} ms per sample the transforms take timed one by one") if total else None
    else:
        action = f"Make {which} cheaper"
        figure = f"{per_sample:.2f} ms per sample alone" if per_sample is not None else None
    return finding("augment", "augment", action, named + generic, numbers, figure=figure)


def _confirmed(b) -> Optional[tuple]:
    """(numbers, sentence) of the costliest transform measured in the pipeline
    (confirm.py), where it was and its cost is real; else None."""
    cf = b.confirmed if b is not None and b.ok else None
    if cf is None or not cf.ok or not cf.real:
        return None
    numbers = {"transform": cf.transform, "where": cf.where, "measured_ms_per_batch": cf.measured_ms_per_batch,
               "tolerance_ms": cf.tolerance_ms, "predicted_ms_per_batch": cf.predicted_ms_per_batch}
    pm = f" ± {cf.tolerance_ms:.1f}" if cf.tolerance_ms is not None else ""
    return numbers, (f" Measured in the pipeline, {cf.transform} ({cf.where}) costs the loop "
                     f"{cf.measured_ms_per_batch:.1f}{pm} ms per batch.")


def _costliest_parts(b) -> tuple[list, str]:
    """The costliest transforms of the breakdown (the fewest making up PARTS_NAMED_SHARE
    of the timed sum, at most PARTS_NAMED), as numbers and as sentences naming each with
    its cost, share and remedy; nothing with fewer than two transforms timed."""
    timed = [row for row in (b.rows or ()) if row.ok and row.ms_per_sample is not None] if b is not None and b.ok else []
    total = sum(row.ms_per_sample for row in timed)
    if len(timed) < 2 or total <= 0:
        return [], ""
    chosen, share = [], 0.0
    for row in sorted(timed, key=lambda x: -x.ms_per_sample)[:PARTS_NAMED]:
        chosen.append(row)
        share += row.ms_per_sample / total
        if share >= PARTS_NAMED_SHARE:
            break
    of = f"{total:.2f} ms/sample" + ("" if len(timed) == len(b.rows) else " timed (not every transform was)")
    parts, text = [], []
    for row in chosen:
        remedy = _part_remedy(row, b.reorders)
        parts.append({"name": row.name, "where": row.where, "ms_per_sample": row.ms_per_sample,
                      "share": _r(row.ms_per_sample / total, 4), "input": row.input, "output": row.output,
                      "remedy": remedy})
        text.append(f" {row.name} ({row.where}) costs {row.ms_per_sample:.2f} of {of} "
                    f"({row.ms_per_sample / total * 100:.0f}%)" + (f": {remedy}." if remedy else "."))
    return parts, "".join(text)


# What makes a transform of each kind cheaper, by class name (torchvision v1 and v2).
RESIZES = frozenset({"Resize", "RandomResizedCrop", "RandomResize", "RandomShortestSize", "ScaleJitter"})
AUTO_AUGMENTS = frozenset({"AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix"})
# per pixel (or a small neighbourhood): the same after a crop, on fewer pixels
PIXELWISE = frozenset({"ColorJitter", "RandomPhotometricDistort", "RandomAdjustSharpness", "RandomAutocontrast",
                       "RandomEqualize", "RandomPosterize", "RandomSolarize", "RandomGrayscale", "Grayscale",
                       "RandomInvert", "GaussianBlur", "GaussianNoise"})
# warps: after a crop they would bring the borders in, so only batched on the device
WARPS = frozenset({"RandomRotation", "RandomAffine", "RandomPerspective", "ElasticTransform"})
TO_FLOAT = frozenset({"Normalize", "ToDtype", "ConvertImageDtype"})
ON_DEVICE = ("run it batched on the device inside the step (torchvision v2 transforms take batched tensors; "
             "one random draw per batch)")


def _part_remedy(row, reorders: Optional[tuple] = None) -> Optional[str]:
    """What makes this transform cheaper, by its class name, or None when nothing
    specific is known (the finding then says what to do in general); a move after a crop
    that was timed (`reorders`, reorder.py) is said with what it saved; an untimed one is
    never offered (reorder.py's table decides what may move: a warp or an albumentations
    transform between the op and the crop would change what the model sees)."""
    name = row.name
    if name in RESIZES:
        before, after = _pixels(row.input), _pixels(row.output)
        if before and after and before >= SHRINK_RATIO * after:
            return (f"it shrinks {row.input} to {row.output}, so store the images pre-resized near that size, or "
                    "decode them at a reduced size (PIL's Image.draft for JPEG)")
        return None
    if name in AUTO_AUGMENTS:
        return "use fewer ops or a lower magnitude (num_ops, magnitude), or " + ON_DEVICE
    if name in WARPS:
        return ON_DEVICE
    if name in PIXELWISE:
        blur = "use a smaller kernel_size, " if name == "GaussianBlur" else ""
        timed = next((x for x in reorders or () if name in (x.transform or "").split(", ")
                      and row.where in (x.where or "")), None)
        if timed is not None and timed.real is not None and timed.saving_ms_per_sample is not None:
            if timed.real:  # the move was timed (reorder.py): its saving, not a guess
                return (f"{blur}move it after {timed.after} ({timed.after_where}): on the same inputs that saved "
                        f"{timed.saving_ms_per_sample:.2f} ms per sample; or " + ON_DEVICE)
            return f"{blur}{ON_DEVICE}; moved after {timed.after} it saved nothing beyond the noise"
        return f"{blur}{ON_DEVICE}"
    if name in TO_FLOAT:
        return ("do it on the device inside the step: keep the batch uint8 through the loader (less to copy), then "
                "convert and normalize it there")
    if name == "ToTensor":
        return ("use PILToTensor (uint8) instead, and convert to float and normalize on the device inside the "
                "step")
    return None


def _pixels(described: Optional[str]) -> Optional[int]:
    """Pixels of an image as breakdown.describe wrote it: "500x375 RGB" (a PIL image, W x
    H) or "3x224x224 uint8" (a tensor, the last two dimensions); None when not an image."""
    head = (described or "").split(",")[0].split(" ")[0]
    try:
        dims = [int(d) for d in head.split("x")]
    except ValueError:
        return None
    return dims[-1] * dims[-2] if len(dims) >= 2 else None


# Transforms whose result depends on a statistic of the whole image (reorder.MOVABLE's
# "statistics"): moved after a crop, the statistic is the crop's.
_IMAGE_STATISTICS = {"ColorJitter": "ColorJitter's contrast (when set) blends with the image's mean",
                     "RandomAutocontrast": "RandomAutocontrast stretches the image's range",
                     "RandomEqualize": "RandomEqualize flattens the image's histogram",
                     "RandomPhotometricDistort": "RandomPhotometricDistort's contrast blends with the image's mean"}


def _reorder(c: _Context):
    """An augment bottleneck whose photometric transforms run on more pixels than a later
    crop keeps, found faster moved after it on the same inputs (reorder.py) -> the move,
    with both timings. Measured transform by transform in this process: the tool cannot
    reorder the user's transforms, so the full pipeline's gain is not checked (no
    `recommended`: verified stays empty, as for the augment item)."""
    if c.b != "augment" or not c.significant("augment"):
        return None
    aug = c.part("augment")
    b = aug.breakdown if aug is not None else None
    items = c.r.isolated.items_per_batch if c.r.isolated is not None else None
    out = []
    for r in (b.reorders or () if b is not None and b.ok else ()):
        if not r.real:
            continue
        per_batch = r.saving_ms_per_sample * items if items else None
        batch = f", {per_batch:.1f} ms per batch of {items:g}" if per_batch is not None else ""
        fewer = (f"; it then runs on {r.pixels_after:,} pixels instead of {r.pixels_before:,}"
                 if r.pixels_before and r.pixels_after else "")
        tol = f"\u00b1 {r.tolerance_ms:.2f}" if r.tolerance_ms is not None else "(noise unknown)"
        order = f" New order: {', '.join(r.order)}." if r.order else ""
        stats = [_IMAGE_STATISTICS[n] for n in r.transform.split(", ") if n in _IMAGE_STATISTICS]
        caveat = (" " + "; ".join(stats) + ": after the move, the crop's (the usual recipes' order)." if stats else "")
        out.append(finding("reorder", "augment", f"Move {r.transform} ({r.where}) after {r.after} ({r.after_where})", (
            f"{r.ms_per_sample:.2f} \u2192 {r.reordered_ms_per_sample:.2f} ms per sample on the same inputs{fewer}."
            f"{order}{caveat} Timed alone in this process, alternating both orders; the tool cannot reorder your "
            "transforms, so the full pipeline's gain is not checked: check it with compare (a run before and after)."),
            {"transform": r.transform, "where": r.where, "after": r.after, "after_where": r.after_where,
             "order": list(r.order or ()), "ms_per_sample": r.ms_per_sample,
             "reordered_ms_per_sample": r.reordered_ms_per_sample, "saving_ms_per_sample": r.saving_ms_per_sample,
             "tolerance_ms": r.tolerance_ms, "samples": r.samples, "items_per_batch": items,
             "saving_ms_per_batch": _r(per_batch), "pixels_before": r.pixels_before, "pixels_after": r.pixels_after},
            figure=f"saves {r.saving_ms_per_sample:.2f} {tol} ms per sample{batch}"))
    return out


def _handoff(c: _Context):
    """A handoff bottleneck -> the payload the workers send, with its size."""
    if c.b != "handoff" or not c.significant("handoff"):
        return None
    ms = c.stage_ms("handoff")
    batch = c.part("batch") or BatchShape()
    numbers = {"handoff_ms_per_batch": _r(ms), "batch_bytes": batch.bytes, "n_tensors": batch.n_tensors,
               "num_workers": c.workers, "pin_memory": c.lo.get("pin_memory")}
    size = (f"Each batch the workers hand over is {batch.n_tensors} tensor(s), {batch.bytes / 2**20:.1f} MB, with "
            f"num_workers={c.workers}: the handoff's cost grows with its bytes." if batch.bytes else
            f"The handoff's cost, with num_workers={c.workers}, grows with the bytes each batch carries.")
    numbers["headroom"] = headroom(c, "handoff")
    pin = (" pin_memory=True pins each batch in the loop's pinning thread: check it against pin_memory=False with "
           "--sweep pin_memory=0,1." if c.lo.get("pin_memory") else "")
    # handoff's cost and headroom are the verdict's own figures (it is the bottleneck): said once, above
    return finding("handoff", "handoff", "Send fewer, more compact tensors from the workers (uint8 instead of "
                   "float, no unused fields)", size + pin, numbers,
                   figure=f"{batch.bytes / 2**20:.1f} MB a batch" if batch.bytes else None)


def _batch_size(c: _Context):
    """CUDA, step-bound (not input-bound) and most of the GPU memory unused -> a larger batch."""
    if not c.cuda:
        return None
    mem = c.part("memory")
    frac = mem.fraction if mem is not None else None
    if frac is None or frac >= MEMORY_UNUSED_FRACTION or input_bound_class(c.r) != "not":
        return None
    bs = c.r.batch_size
    room = int(bs * MEMORY_UNUSED_FRACTION / max(frac, 1e-6))
    return finding("batch_size", "step", f"Raise the batch size, up to about {room} from {bs}", (
        f"The step is the limit and peaks at {mem.peak_bytes / 2**30:.2f} GB of {mem.total_bytes / 2**30:.0f} GB "
        "GPU memory: a larger batch, keeping half the memory free, raises samples/s. It changes the optimization: "
        "retune the learning rate."),
        {"peak_bytes": mem.peak_bytes, "total_bytes": mem.total_bytes, "fraction": frac, "batch_size": bs,
         "batch_size_fits_about": room}, figure=f"the step peaks at {frac * 100:.0f}% of the GPU's memory")


def _syncs(c: _Context):
    """Host-device syncs counted in the step (CUDA) -> where they are and why they hurt."""
    s = c.r.syncs
    if s is None or not s.ok or not s.per_step:
        return None
    per = s.per_step
    sites = ", ".join(f"{x.where} ({x.count}x)" for x in (s.sites or ())[:3])
    cls = input_bound_class(c.r)
    tie = (f" The pipeline is {cls} input-bound: a syncing step also stalls while it waits, so the loader's "
           "prefetching overlaps less." if cls in ("moderately", "highly") else "")
    return finding("syncs", "step", "Remove .item(), .cpu(), print of tensors and data-dependent shapes from the "
                   "step, or accumulate metrics on the device", (
                       f"The training step synchronizes host and device {per:g} time(s) per step (at {sites}): each "
                       "sync stops the CPU from queueing work until the GPU catches up." + tie),
        {"per_step": per, "total": s.total, "steps": s.steps, "sites": [x.to_dict() for x in s.sites or ()],
         "input_bound_class": cls}, figure=f"{per:g} sync(s) per step")


def _allocator(c: _Context):
    """The step alone costs more with glibc's default malloc settings than with freed
    memory kept (allocator.Held.time_step) -> the variables that keep it."""
    a = c.part("allocator")
    if a is None or not a.real:
        return None
    d, h = a.default_ms_per_batch, a.held_ms_per_batch
    gain = d / h - 1 if h else None
    return finding("allocator", "step", "Start training with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=-1", (
        f"The step alone takes {d:.1f} ms per batch with this process's malloc settings and {h:.1f} ms with freed "
        "memory kept for reuse: glibc gives the step's freed activation memory back to the OS and the next step "
        "page-faults it in again (in your loop, other allocations between steps can make it worse). The variables "
        "keep at most the process's peak; or preload jemalloc or tcmalloc (LD_PRELOAD=libjemalloc.so.2)."),
        {"default_ms_per_batch": d, "held_ms_per_batch": h, "cost_ms_per_batch": a.cost_ms_per_batch,
         "noise_ms": a.noise_ms, "gain_if_held": _r(gain, 4) if gain is not None else None,
         "recommended": {"env": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "-1"}}},
        figure=f"measured {gain * 100:+.0f}% for the step alone" if gain else None)
