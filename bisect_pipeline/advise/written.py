"""What `run --tune --patch` writes, and which figure its check compares the patched script
with: pure.

The change is the search's best settings (tune.py), and one of the pipeline's own fixes
the script can be given (WRITTEN: the device tail, patch_tail.py; decode by torchvision,
patch_decode.py) where the advice's check (turns.py) measured it to help:

- on top of the best's settings, where the check measured it there (its `base`: the
  workers item's settings, the same as the search's best), and only where it helps
  there: the patched script is compared with that trial's candidate side, the settings
  and the fix together;
- on the user's settings, where nothing was measured on top of the best's (and nothing
  measured on top of other settings says it does not help there): the diff holds both,
  and the patched script is compared with the search's figure for the settings alone,
  said so, a run faster than that being what the fix adds (`whole` False);
- alone, where the search found nothing that beats the user's: compared with the fix's
  own figure on the user's settings.

Of two fixes that both qualify, the one measured on top of the best's settings, then the
faster, goes: the two are not measured together. Where no fix is measured to help, the
change is the settings alone; where the script cannot take the one chosen (patch_tail,
patch_decode say why), the other where it qualifies (change.patched), else the settings
alone.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..core.fixes import DECODE, DEVICE_TAIL
from ..core.results import Trial
from ..derive.findings import Outcome
from .outcome import FIX, FIX_WORDS, interval, outcome, settings_text


# The fixes a script's change can hold, one at a time, in the order they are preferred
# where they measured the same.
WRITTEN = (DEVICE_TAIL, DECODE)
# Each as the sentence "faster than that is what ... adds" names it.
_SHORT = {DEVICE_TAIL: "the tail", DECODE: "torchvision's decode"}


@dataclasses.dataclass(frozen=True)
class Written:
    """What the change writes (`settings`: the search's best, with FIX where a fix goes
    with it) and the figure its check compares the patched script with: `reference`, the
    trial whose candidate side is the change (the best's; the fix's on top of the best's
    settings; the fix's own on the user's settings), `users`, the trial whose user side is
    the user's own settings; `whole` False where the reference is the settings alone and
    the fix was not measured on top of them (the patched script may be faster than it by
    the fix's part); `measured`, the fix's own trial that qualified it (None: no fix)."""

    settings: dict
    reference: Trial
    users: Trial
    whole: bool = True
    measured: Optional[Trial] = None


def choose(best: Optional[dict], searched: Optional[Trial], fixes: list, on_best: list, batch_size: float, *,
           kinds: tuple = WRITTEN) -> Optional[Written]:
    """What is written (see the module's docstring): `best`, the search's best settings
    (None: nothing beat the user's) and `searched`, its trial; `fixes`, the check's trials
    of the fixes (each trial's `item` its kind), `on_best` those of them measured on top
    of the best's settings; `kinds`, the fixes the script may be given. None where
    nothing is written."""
    options = [o for kind in kinds if kind in WRITTEN
               for o in [_with(kind, best, searched, [x for x in fixes if x.item == kind],
                               [x for x in on_best if x.item == kind], batch_size=batch_size)] if o is not None]
    if options:
        return max(options, key=lambda o: (o[1].whole and o[1].reference.base is not None, o[0],
                                           -WRITTEN.index(o[1].settings[FIX])))[1]
    return None if best is None else Written(dict(best), searched, searched)


def _with(kind: str, best: Optional[dict], searched: Optional[Trial], fixes: list, on_best: list, *,
          batch_size: float) -> Optional[tuple]:
    """(the fix's measured speed-up, the Written that holds it) where `kind` qualifies
    (see the module's docstring), else None."""
    alone = next((x for x in reversed(fixes) if not x.base), None)
    tops = [x for x in fixes if x.base]

    def helps(x: Optional[Trial]) -> bool:
        return x is not None and outcome(x, batch_size).status == "helps"

    def speed(x: Trial) -> float:
        return outcome(x, batch_size).speedup or 0.0

    if best is None:
        return (speed(alone), Written({FIX: kind}, alone, alone, measured=alone)) if helps(alone) else None
    top = on_best[-1] if on_best else None
    if helps(top):
        return speed(top), Written({**best, FIX: kind}, top, searched, measured=top)
    if top is None and helps(alone) and all(helps(x) for x in tops):
        return speed(alone), Written({**best, FIX: kind}, searched, searched, whole=False, measured=alone)
    return None


def fix_in(patch: Optional[dict]) -> Optional[str]:
    """The fix the change written holds (the patch's JSON form), or None."""
    return next((c.get("setting") for c in ((patch or {}).get("changes") or ())
                 if c.get("setting") in WRITTEN and c.get("how") != "not applied"), None)


def kinds_of(patch: Optional[dict]) -> tuple:
    """The fixes `choose` may write, once the patch is made (its JSON form): the one it
    holds, or none; every one before (None)."""
    if patch is None:
        return WRITTEN
    fix = fix_in(patch)
    return (fix,) if fix else ()


def fix_said(w: Optional[Written], batch_size: float) -> str:
    """The fix in the change, as the search's summary says it ("" where there is none)."""
    if w is None or FIX not in w.settings:
        return ""
    o = outcome(w.reference, batch_size)
    words = FIX_WORDS[w.settings[FIX]]
    if w.reference.base:
        return f" The change adds {words}, measured on top of these by the advice's check: {_figure(o)} more."
    if not w.whole:
        own = outcome(w.measured, batch_size) if w.measured is not None else None
        at = f" at {_figure(own)}" if own is not None and own.speedup else ""
        return f" The change adds {words}, which the advice's check measured{at} on your settings, not on top of these."
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
    return (f"it is compared with the search's {ms:.1f} ms per batch for the settings alone, since the advice's "
            f"check did not measure {FIX_WORDS[w.settings[FIX]]} on top of them: faster than that is what "
            f"{_SHORT[w.settings[FIX]]} adds, slower beyond the noise is a difference")
