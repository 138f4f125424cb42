"""What the advice's rules read (`Context`): a diagnosis in the making, read once. Its verdict
(stage costs from the bisection), `loader` (the user's settings, LoaderSpec.settings()),
`isolated` (costs measured alone: isolate.py) and `syncs` (host-device syncs in the step).
Separate from the rules (rules_*.py): every rule reads this one context and the figures
derived from it (a stage's headroom, the input-bound class, which the report reads too)."""

from __future__ import annotations

from typing import Optional

from ..core.results import Part
from ..core.stats import MIN_REL_DROP, is_real
from ..derive.findings import Diagnosis as Report
from ..derive.verdict import in_question, named_cost


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
NODES_KIND = "torchdata.nodes"  # LoaderSpec.settings()["kind"] of a torchdata.nodes graph


def is_graph(loader: Optional[dict]) -> bool:
    """Whether the loader settings (LoaderSpec.settings) are a torchdata.nodes graph's."""
    return (loader or {}).get("kind") == NODES_KIND


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


class Context:
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
        self.t_full = sec_per_batch(r, "full")
        self.t_ceiling = _ceiling(r)

    def stage(self, name: str):
        try:
            return self.r.stage(name)
        except KeyError:
            return None

    def significant(self, name: str) -> bool:
        """A stage cost to act on: real by the rounds, or named (or tied) on the stages'
        costs alone where the rounds could not tell (verdict.Verdict.witness)."""
        s, v = self.stage(name), self.r.verdict
        if v.within and name == v.bottleneck:  # named within a row the costs alone split
            return True
        if s is None or s.status != "ok":
            return False
        return s.significant or (v.witness == "isolated costs" and name in in_question(v))

    def stage_ms(self, name: str) -> Optional[float]:
        """The stage's row as the rounds read it (the stages merged into it included)."""
        s = self.stage(name)
        return None if s is None or s.sec_per_batch is None else s.sec_per_batch * 1e3

    def cost_ms(self, name: str) -> Optional[float]:
        """What the verdict gives the stage per batch (verdict.named_cost): its cost alone
        within a row the costs alone split, else its row's reading."""
        sec = named_cost(self.r.verdict, name)
        return None if sec is None else sec * 1e3

    def part(self, name: str) -> Optional[Part]:
        """The isolated measurement `name` (isolate.py) when it was made, else None."""
        return self.r.isolated.part(name) if self.r.isolated is not None else None


def sec_per_batch(r: "Report", point: str) -> Optional[float]:
    """The point's time per batch as the report shows it (Report.rate)."""
    rate = r.rate(point)
    return r.batch_size / rate if rate else None


def _ceiling(r: "Report") -> Optional[float]:
    if r.verdict.ceiling and r.verdict.ceiling in r.verdict.fitted:
        return r.verdict.fitted[r.verdict.ceiling]
    for name in ("device", "host", "collated", "augmented", "raw"):
        t = sec_per_batch(r, name)
        if t is not None:
            return t
    return None


def rounded(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def headroom(r: "Report", stage: str) -> dict:
    """If `stage` were free: the bisection's samples/s and the gain over the full
    pipeline (0.33 = +33%), or {} when the stage was not costed."""
    c = r if isinstance(r, Context) else Context(r)
    s = c.stage(stage)
    if s is None or s.status != "ok" or s.samples_per_sec_if_free is None or not c.t_full:
        return {}
    full = c.r.batch_size / c.t_full
    return {"samples_per_sec": rounded(full, 1), "samples_per_sec_if_free": rounded(s.samples_per_sec_if_free, 1),
            "gain_if_free": rounded(s.samples_per_sec_if_free / full - 1, 4)}


def headroom_text(h: dict, stage: str) -> str:
    if not h:
        return ""
    return (f" If {stage} were free: {h['samples_per_sec_if_free']:,.0f} samples/s instead of {h['samples_per_sec']:,.0f} "
            f"({h['gain_if_free'] * 100:+.0f}%).")
