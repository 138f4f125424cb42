"""How an advice item reads: its message composed from its parts (`finding`), its headline and
reasoning, and again once checked (`checked`). Separate from the rules that make the items
(rules_*.py): the reports and the diagnosis read every item through these functions."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..derive.findings import Checked, Finding
from .outcome import NODE_SETTING, settings_text
from .outcome import detail as outcome_detail, figure as outcome_figure, sentence as outcome_sentence


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


def size_text(nbytes: float) -> str:
    """'2.0 MB', '150 KB', '512 bytes' (powers of ten, as MB/s is)."""
    if nbytes >= 1e6:
        return f"{nbytes / 1e6:,.1f} MB"
    return f"{nbytes / 1e3:,.0f} KB" if nbytes >= 1e3 else f"{nbytes:.0f} bytes"
