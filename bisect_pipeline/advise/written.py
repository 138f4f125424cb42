"""What `run --tune --patch` writes, and which figure its check compares the patched script
with: pure.

The change is the search's best settings (tune.py), and the device tail (patch_tail.py)
where the advice's check (turns.py) measured it to help:

- on top of the best's settings, where the check measured it there (its `base`: the
  workers item's settings, the same as the search's best), and only where it helps
  there: the patched script is compared with that trial's candidate side, the settings
  and the tail together;
- on the user's settings, where nothing was measured on top of the best's (and nothing
  measured on top of other settings says it does not help there): the diff holds both,
  and the patched script is compared with the search's figure for the settings alone,
  said so, a run faster than that being what the tail adds (`whole` False);
- alone, where the search found nothing that beats the user's: compared with the tail's
  own figure on the user's settings.

Where the tail is not measured to help, the change is the settings alone, as before;
where the script cannot take it (patch_tail says why), too.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..core.fixes import DEVICE_TAIL
from ..core.results import Trial
from ..derive.findings import Outcome
from .outcome import FIX, FIX_WORDS, interval, outcome, settings_text


@dataclasses.dataclass(frozen=True)
class Written:
    """What the change writes (`settings`: the search's best, with FIX where the device
    tail goes with it) and the figure its check compares the patched script with:
    `reference`, the trial whose candidate side is the change (the best's; the tail's on
    top of the best's settings; the tail's own on the user's settings), `users`, the trial
    whose user side is the user's own settings; `whole` False where the reference is the
    settings alone and the tail was not measured on top of them (the patched script may
    be faster than it by the tail's part)."""

    settings: dict
    reference: Trial
    users: Trial
    whole: bool = True


def choose(best: Optional[dict], searched: Optional[Trial], fixes: list, on_best: list, batch_size: float, *,
           tail: bool = True) -> Optional[Written]:
    """What is written (see the module's docstring): `best`, the search's best settings
    (None: nothing beat the user's) and `searched`, its trial; `fixes`, the check's trials
    of the device tail, `on_best` those of them measured on top of the best's settings;
    `tail` False: the script cannot take the tail. None where nothing is written."""
    alone = next((x for x in reversed(fixes) if not x.base), None)
    tops = [x for x in fixes if x.base]

    def helps(x: Optional[Trial]) -> bool:
        return x is not None and outcome(x, batch_size).status == "helps"

    if best is None:
        return Written({FIX: DEVICE_TAIL}, alone, alone) if tail and helps(alone) else None
    top = on_best[-1] if on_best else None
    if tail and helps(top):
        return Written({**best, FIX: DEVICE_TAIL}, top, searched)
    if tail and top is None and helps(alone) and all(helps(x) for x in tops):
        return Written({**best, FIX: DEVICE_TAIL}, searched, searched, whole=False)
    return Written(dict(best), searched, searched)


def tail_in(patch: Optional[dict]) -> bool:
    """Does the change written (the patch's JSON form) hold the device tail?"""
    return any(c.get("setting") == DEVICE_TAIL and c.get("how") != "not applied"
               for c in ((patch or {}).get("changes") or ()))


def tail_said(w: Optional[Written], batch_size: float) -> str:
    """The device tail in the change, as the search's summary says it ("" where it is not)."""
    if w is None or FIX not in w.settings:
        return ""
    o = outcome(w.reference, batch_size)
    words = FIX_WORDS[DEVICE_TAIL]
    if w.reference.base:
        return f" The change adds {words}, measured on top of these by the advice's check: {_figure(o)} more."
    if not w.whole:
        return f" The change adds {words}, which the advice's check measured on your settings, not on top of these."
    return f" The change is {words}, which the advice's check measured at {_figure(o)} your speed."


def _figure(o: Outcome) -> str:
    return f"{o.speedup:.2f}\u00d7" + (f" ({interval(o)})" if interval(o) else "")


def compared_with(w: Optional[Written], batch_size: float, graph: bool = False) -> Optional[str]:
    """Which figure the patched script's run is compared with, in words (the report's
    applied_text), with its time per batch; None where it has none."""
    if w is None:
        return None
    o = outcome(w.reference, batch_size)
    ms = o.ms_per_batch[1] if o.ms_per_batch else None
    if ms is None:
        return None
    if FIX not in w.settings:
        return f"the search measured {ms:.1f} ms per batch with these settings"
    if w.reference.base:
        return (f"the advice's check measured {ms:.1f} ms per batch with {settings_text(w.settings, graph)}, on top "
                "of the settings")
    if w.whole:
        return f"the advice's check measured {ms:.1f} ms per batch with {settings_text(w.settings, graph)}"
    return (f"it is compared with the search's {ms:.1f} ms per batch for the settings alone, since "
            f"{FIX_WORDS[DEVICE_TAIL]} was not measured on top of them: faster than that is what the tail adds, "
            "slower beyond the noise is a difference")
