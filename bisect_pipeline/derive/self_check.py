"""The report's rules checked on the numbers it will show (pure): what SPEC.md calls "Rules
that are not negotiable", as a last check of a verdict (verdict.py) and the rates shown
beside it; a broken rule is the tool's bug, said as such in the report's warnings.
"""

from __future__ import annotations

from typing import Mapping, Optional

from .drops import POINTS, STAGES
from .verdict import Verdict


def self_check(points: Mapping[str, float], v: Verdict, num_workers: Optional[int], pinned_transfer: bool) -> list:
    """The report's rules (SPEC.md, "Rules that are not negotiable") checked on the
    numbers the report will show: `points` maps each ok point to the samples/s it shows.
    Returns one warning line per broken rule (none when the report agrees with itself)."""
    out = []
    names = [p for p in POINTS if p in points]
    for i, up in enumerate(names):
        for down in names[i + 1:]:
            if points[down] < points[up] * (1 - 1e-6):  # the shown rates are fitted: any slower is a bug
                out.append(f"{down} slower than {up}")
    real = [s for s in v.stages if s.status == "ok" and s.significant]
    for s in real:
        if (s.share_of_gap or 0) > 1.0 + 1e-9:
            out.append(f"{s.stage} at {s.share_of_gap:.0%} of the gap")
    if v.bottleneck == "none" and real:
        out.append(f"none beside a real cost of {', '.join(s.stage for s in real)}")
    if v.bottleneck in STAGES and v.witness != "isolated costs" and any(not lead.real for lead in v.leads):
        out.append(f"{v.bottleneck} named on a lead within the noise")
    if v.bottleneck == "tie" and v.witness != "disagree" and any(lead.real for lead in v.leads if lead.over in v.tied):
        out.append(f"a tie of {', '.join(v.tied)} led beyond the noise")
    if num_workers == 0 and not pinned_transfer and any(s.stage == "handoff" for s in real):
        out.append("a real handoff at num_workers=0")
    # a rule broken is the tool's bug, not the pipeline's: the document reproduces it
    return [f"Tool bug ({p}): report it with the --json file." for p in out]
