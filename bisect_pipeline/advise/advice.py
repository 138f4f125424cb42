"""What to change: typed findings from the measured numbers and the loader's settings.

Every rule fires only when its measured condition holds, and every finding carries the
numbers it rests on (`numbers`), so the advice is data first (the JSON's `advice`) and
text second. Nothing here is generic: no number, no finding. Each rule lives in the
rules_*.py module of what it speaks for; `RULES` lists them all in the report's order,
`findings` runs them on one context.Context and `ranked` orders what they found.
"""

from __future__ import annotations

from ..derive.findings import Diagnosis as Report, Finding
from . import rules_augment, rules_batch, rules_fixes, rules_load, rules_step, rules_workers
from .context import Context
from .outcome import predicted


RULES = (rules_workers.workers, rules_workers.graph_mappers, rules_batch.pin_memory, rules_workers.restart,
         rules_batch.uint8_payload, rules_fixes.device_tail, rules_batch.collate, rules_load.storage,
         rules_fixes.decode, rules_augment.augment, rules_fixes.device_augment, rules_augment.reorder,
         rules_batch.handoff, rules_step.batch_size, rules_step.syncs, rules_step.allocator)
# Items that blame the batch's payload for a cost of moving it (the restart item ranks
# before them when its measured gain is the bigger: ranked).
PAYLOAD_KINDS = ("uint8_payload", "device_tail", "handoff")


def findings(r: "Report") -> list:
    """Every rule whose measured condition holds, in the report's order."""
    ctx = Context(r)
    out: list = []
    for rule in RULES:
        found = rule(ctx)
        if found:
            out.extend(found if isinstance(found, list) else [found])
    if any(f.kind == "device_tail" and not f.numbers.get("refused") for f in out):  # the same move, built and checked
        out = [f for f in out if f.kind != "uint8_payload"]
    return out


def ranked(advice: tuple) -> tuple:
    """The advice in the report's order, but the restart item (persistent_workers) before
    the payload items when its measured gain is the bigger: its check's speed-up against
    theirs (measured when checked, else the gain if their stage were free, which no payload
    change can beat); after them otherwise. Items whose check measured a gain come first
    (the summary's first change is the first of them: report/summary.first_item), in that
    order among themselves; items whose check measured no gain or a loss come last: they
    are told, not proposed."""
    restart = next((f for f in advice if f.kind == "persistent_workers"), None)
    payload = [f for f in advice if f.kind in PAYLOAD_KINDS]
    out = list(advice)
    if restart is not None and payload:
        mine = restart.verified.speedup if restart.verified is not None and restart.verified.status == "helps" else None
        theirs = max(_gain(f) for f in payload)
        rest = [f for f in advice if f is not restart]
        at = rest.index(payload[0]) if mine is not None and mine >= theirs else rest.index(payload[-1]) + 1
        out = rest[:at] + [restart] + rest[at:]
    return tuple(sorted(out, key=_rank))


def _rank(f: Finding) -> int:
    status = f.verified.status if f.verified is not None else None
    return 0 if status == "helps" else 2 if status in ("no gain", "slower") else 1


def _gain(f: Finding) -> float:
    v = f.verified
    if v is not None and v.status == "helps" and v.speedup:
        return v.speedup
    return predicted(f) or 1.0

