"""The device tail written against the user's script (`--patch`, patch.make): the
transforms list split where it is built, and the tail applied where the training loop
moves the batch to the device.

    transform=transforms.Compose([                 transform=transforms.Compose([
        transforms.ToTensor(),               ->        transforms.PILToTensor()
        transforms.Normalize((0.1307,), ...)           ])
        ])
    data, target = data.to(device), ...      ->    data, target = device_tail(data.to(device)), ...

with `device_tail = transforms.Compose([transforms.ConvertImageDtype(torch.float32),
transforms.Normalize((0.1307,), ...)])` after the script's imports: ToTensor's scaling is
ConvertImageDtype's (to float, / 255: the same arithmetic), the moved transforms are the
user's own, as written.

Written only where the script's shape makes it safe, else "not applied" with why (the
report then shows the change as code, measure/tail.Split.code): exactly one
`Compose([...])` list in the script whose transforms are the user's, by name and order
(measure/tail's Fix: `kept` and `moved`); the moved transforms' arguments constants or
names the module's imports bind (`torch.float32`: the tail is built at the top of the
module, where no other name is known); the transforms'
module and `torch` imported at the top; the batch a tuple whose first part the tail acts
on (`[0]`); and at least one loop `for x, y in LOADER` (or `enumerate(LOADER)`) that
moves `x` with `x.to(...)`. Every such loop gets the tail: the split list feeds each
loader built over it (the MNIST example's test loop reads the same transform), so its
batches arrive as uint8 there too. Pure, as patch.py.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..core.fixes import DEVICE_TAIL
from .edits import Change, Edits
from .script_ast import Script, after_imports, called_through, imported_names, name_of

NAME = "device_tail"
SCALING = "ToTensor's scaling"  # measure/tail: ToTensor split into PILToTensor and its scaling


def rewrite(s: Script, fix: dict, edits: Edits) -> Change:
    """The device tail's Change: its edits in `edits` ("lines"), or "not applied" and why."""
    why = _why_not(fix)
    found = None if why else _compose(s, fix)
    if isinstance(found, str) or why:
        return Change(DEVICE_TAIL, True, "not applied", None, why or found)
    call, moved = found
    prefix = called_through(s, call.args[0].elts[0].func)
    tail, why = _tail(s, fix, moved, prefix)
    loops = _moves(s, fix)
    if why or isinstance(loops, str):
        return Change(DEVICE_TAIL, True, "not applied", s.where(call), why or loops)
    elts = call.args[0].elts
    kept = elts[: len(elts) - len(moved)]
    if SCALING in fix.get("moved", ()):
        edits.replace(kept[-1], f"{prefix}PILToTensor()")
    cut_from = s.end(kept[-1]) if kept else s.start(moved[0])
    edits.cut(cut_from, s.end(moved[-1]))
    edits.insert_lines(after_imports(s.tree), ["# bisect-pipeline: the end of the transforms, run batched on the device "
                                           "in the training step", f"{NAME} = {tail}"])
    for node in loops:
        edits.replace(node, f"{NAME}({s.text(node)})")
    lines = ", ".join(str(n.lineno) for n in loops)
    return Change(DEVICE_TAIL, True, "lines", s.where(call),
                  f"the transforms' list split at line {call.lineno} ({', '.join(fix.get('moved', ()))} out of the "
                  f"workers), {NAME} applied where the batch is moved to the device (line{'s' * (len(loops) > 1)} {lines})")


def _why_not(fix: dict) -> Optional[str]:
    if fix.get("kind") != DEVICE_TAIL or not fix.get("moved"):
        return "only the device tail and decode by torchvision are written as a diff"
    if fix.get("path") != "[0]":
        return f"the tail acts on the batch's part {fix.get('path')}: only a batch's first part is rewritten"
    return None


def originals(fix: dict) -> list:
    """The user's transforms by name, in order, from the Fix: kept, then moved (ToTensor
    where it was split into PILToTensor and its scaling)."""
    kept, moved = list(fix.get("kept", ())), list(fix.get("moved", ()))
    if SCALING in moved:
        if not kept or kept[-1] != "PILToTensor":
            return []
        kept[-1] = "ToTensor"
        moved.remove(SCALING)
    return kept + moved


def _compose(s: Script, fix: dict):
    """(the one Compose call of the user's list, its moved elements), or why not."""
    names = originals(fix)
    n_moved = len([m for m in fix.get("moved", ()) if m != SCALING])
    found = [c for c in ast.walk(s.tree) if isinstance(c, ast.Call) and name_of(c.func) == "Compose"
             and len(c.args) == 1 and not c.keywords and isinstance(c.args[0], ast.List)
             and all(isinstance(e, ast.Call) for e in c.args[0].elts)
             and [name_of(e.func) for e in c.args[0].elts] == names]
    if len(found) != 1:
        return (f"{'no' if not found else len(found)} Compose([...]) list(s) of {', '.join(names) or 'the transforms'} "
                "in the script: the one to split is not known")
    elts = found[0].args[0].elts
    return found[0], elts[len(elts) - n_moved:]


def _tail(s: Script, fix: dict, moved: list, prefix: str) -> tuple[str, Optional[str]]:
    """The tail's Compose as code, or why it cannot be built at the top of the module."""
    top = imported_names(s)
    root = prefix.split(".")[0]
    if not root or root not in top:
        return "", f"the transforms are not called through a module imported at the top ({prefix or 'bare names'})"
    for e in moved:
        names = {n.id for a in [*e.args, *(k.value for k in e.keywords)] for n in ast.walk(a) if isinstance(n, ast.Name)}
        if not names <= top:
            return "", f"{s.text(e)} takes names the top of the module does not know"
    ops = [s.text(e) for e in moved]
    if SCALING in fix.get("moved", ()):
        if "torch" not in top:
            return "", "torch is not imported at the top of the script"
        ops.insert(0, f"{prefix}ConvertImageDtype(torch.float32)")
    if any(isinstance(n, ast.Name) and n.id == NAME for n in ast.walk(s.tree)):
        return "", f"the script has a name {NAME} already"
    return f"{prefix}Compose([{', '.join(ops)}])", None


def _moves(s: Script, fix: dict):
    """The `x.to(...)` calls of the loops `for x, y in LOADER` (or `enumerate(LOADER)`),
    or why none can take the tail."""
    out = []
    for loop in (n for n in ast.walk(s.tree) if isinstance(n, ast.For)):
        first = _batch_first(loop)
        if first is None:
            continue
        out += [c for stmt in loop.body for c in ast.walk(stmt) if isinstance(c, ast.Call)
                and isinstance(c.func, ast.Attribute) and c.func.attr == "to"
                and isinstance(c.func.value, ast.Name) and c.func.value.id == first]
    if not out:
        return "no training loop moves its batch with `data.to(device)`: apply the tail where the batch reaches the device"
    return out


def _batch_first(loop: ast.For) -> Optional[str]:
    """`data` of `for data, target in loader` or `for i, (data, target) in enumerate(loader)`."""
    target, it = loop.target, loop.iter
    if isinstance(it, ast.Call) and name_of(it.func) == "enumerate" and it.args and isinstance(target, ast.Tuple) \
            and len(target.elts) == 2:
        target, it = target.elts[1], it.args[0]
    if not isinstance(it, (ast.Name, ast.Attribute)) or not isinstance(target, ast.Tuple) or not target.elts:
        return None
    first = target.elts[0]
    return first.id if isinstance(first, ast.Name) else None
