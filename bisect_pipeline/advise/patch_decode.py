"""Decode by torchvision written against the user's script (`--patch`, patch.make): the
ImageFolder the check changed (measure/decode.py) gets a loader that reads and decodes
each file with torchvision, and its transforms' list takes the uint8 tensor it returns:

    datasets.ImageFolder(                              datasets.ImageFolder(
        traindir,                                          traindir,
        transforms.Compose([                               transforms.Compose([
            transforms.RandomResizedCrop(224),   ->            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),                 transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),                             transforms.ConvertImageDtype(torch.float32),
            normalize,                                         normalize,
        ]))                                                ]),
                                                           loader=decode_image_file)

with `decode_image_file` defined after the script's imports (torchvision's `read_file`
and `decode_image` to RGB: the copy the check measured, TorchvisionDecode). The list is
adapted as the check adapted it: ToTensor becomes its scaling (ConvertImageDtype to
float32: the same arithmetic on a uint8 tensor), PILToTensor and ToImage go (the image is
a tensor already), the other transforms stay as written.

Written only where the script's shape makes it safe, else "not applied" with why (the
report then shows the change as code, Fix.code): exactly one `ImageFolder(...)` call of
the script whose transforms, adapted, are the check's (its Fix's `kept`, by name and
order), given as a `Compose([...])` list there or through a name bound once to one and
used only there (a list shared with another dataset would hand that one tensors too);
no loader of its own; `torch` imported at the top where ToTensor is rewritten. Pure,
as patch.py.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..core.fixes import DECODE
from .edits import Change, Edits
from .patch_tail import SCALING
from .script_ast import Script, after_imports, called_through, imported_names, name_of

NAME = "decode_image_file"
# What the check drops from the list (measure/tail.TO_TENSOR: the image is a tensor already).
DROPPED = ("PILToTensor", "ToImage")
DEFINITION = ["", "", "# bisect-pipeline: the images read and decoded by torchvision in the workers, not by PIL",
              f"def {NAME}(path):",
              "    from torchvision.io import ImageReadMode, decode_image, read_file",
              "    return decode_image(read_file(path), mode=ImageReadMode.RGB)"]


class _Code(str):
    """A keyword's value written as code (Edits.add writes repr)."""

    def __repr__(self) -> str:
        return str(self)


def rewrite(s: Script, fix: dict, edits: Edits) -> Change:
    """Decode by torchvision's Change: its edits in `edits` ("lines"), or "not applied" and why."""
    if fix.get("device"):
        return Change(DECODE, True, "not applied", None, f"the decode on {fix['device']} changes the loader's collate "
                      "and the step: apply the code shown in its item")
    if fix.get("kind") != DECODE or not fix.get("kept"):
        return Change(DECODE, True, "not applied", None, "the check's decoded copy is not known")
    found = _folder(s, tuple(fix["kept"]))
    if isinstance(found, str):
        return Change(DECODE, True, "not applied", None, found)
    call, compose, elts = found
    names = [_name(s, e) for e in elts]
    why = None
    if _taken(s):
        why = f"the script has a name {NAME} already"
    elif "ToTensor" in names and "torch" not in imported_names(s):
        why = "torch is not imported at the top of the script"
    elif any(n == "ToTensor" and not isinstance(e, ast.Call) for n, e in zip(names, elts)):
        why = "ToTensor is given through a name: rewrite it where it is built"
    if why:
        return Change(DECODE, True, "not applied", s.where(call), why)
    for e, n in zip(elts, names):
        if n == "ToTensor":
            edits.replace(e, f"{called_through(s, e.func)}ConvertImageDtype(torch.float32)")
    _cut(s, elts, [n in DROPPED for n in names], edits)
    edits.add(call, {"loader": _Code(NAME)})
    edits.insert_lines(after_imports(s.tree), DEFINITION)
    changed = ["ToTensor -> ConvertImageDtype(torch.float32)"] * ("ToTensor" in names) + \
        [f"{n} dropped" for n in names if n in DROPPED]
    return Change(DECODE, True, "lines", s.where(call),
                  f"{name_of(call.func)} at line {call.lineno} reads its images with {NAME} (torchvision's "
                  f"decode_image); its transforms' list at line {compose.lineno} takes the tensor"
                  + (f" ({', '.join(changed)})" if changed else ""))


def _taken(s: Script) -> bool:
    return any(isinstance(n, ast.Name) and n.id == NAME or isinstance(n, ast.FunctionDef) and n.name == NAME
               for n in ast.walk(s.tree))


def adapted_names(names: list) -> tuple:
    """A transforms' list by name, as the check adapts it for a tensor image: ToTensor its
    scaling, PILToTensor and ToImage gone."""
    return tuple(SCALING if n == "ToTensor" else n for n in names if n not in DROPPED)


def _folder(s: Script, kept: tuple):
    """(the ImageFolder call, its Compose call, the list's elements) whose transforms,
    adapted, are `kept`; or why none (or more than one) is."""
    calls = [c for c in ast.walk(s.tree) if isinstance(c, ast.Call) and name_of(c.func) == "ImageFolder"]
    if not calls:
        return "no ImageFolder(...) call in the script: give the dataset the loader where it is built"
    matching, whys = [], []
    for call in calls:
        found = _transforms(s, call)
        if isinstance(found, str):
            whys.append(found)
        elif adapted_names([_name(s, e) for e in found[1]]) == kept:
            matching.append((call, *found))
    if len(matching) == 1:
        return matching[0]
    if matching:
        return f"{len(matching)} ImageFolder(...) calls take these transforms: the one the loader reads is not known"
    return f"no ImageFolder(...) call of the script takes the transforms {', '.join(kept)}" + \
        "".join(f"; {why}" for why in whys)


def _transforms(s: Script, call: ast.Call):
    """(the Compose call, its list's elements) an ImageFolder call takes, or why not."""
    if any(k.arg is None or k.arg == "loader" for k in call.keywords) or len(call.args) > 3 or \
            any(isinstance(a, ast.Starred) for a in call.args):
        return f"{s.text(call.func)}(...) at line {call.lineno} is given its own loader or arguments not shown"
    given = next((k.value for k in call.keywords if k.arg == "transform"), call.args[1] if len(call.args) > 1 else None)
    if isinstance(given, ast.Name):
        given = _bound_once(s, given.id)
    if not (isinstance(given, ast.Call) and name_of(given.func) == "Compose" and len(given.args) == 1
            and not given.keywords and isinstance(given.args[0], ast.List)):
        return (f"the transforms of {s.text(call.func)}(...) at line {call.lineno} are not a Compose([...]) list "
                "written in the script (or one name bound to it, used there alone)")
    elts = given.args[0].elts
    if not all(_name(s, e) for e in elts):
        return f"the list at line {given.lineno} holds transforms the script does not name"
    return given, elts


def _bound(s: Script, name: str) -> list:
    """The values `name` is assigned in the script (`name = ...`, a single target)."""
    return [n.value for n in ast.walk(s.tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]


def _bound_once(s: Script, name: str) -> Optional[ast.AST]:
    """What `name` is bound to where it is assigned once and read once; else None."""
    binds = _bound(s, name)
    reads = [n for n in ast.walk(s.tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    return binds[0] if len(binds) == 1 and len(reads) == 1 else None


def _name(s: Script, e: ast.AST) -> str:
    """A list element's transform by name: a call's, or that of the call a name is bound
    to once (`normalize = transforms.Normalize(...)`); '' where neither."""
    if isinstance(e, ast.Call):
        return name_of(e.func)
    if isinstance(e, ast.Name):
        binds = _bound(s, e.id)
        return name_of(binds[0].func) if len(binds) == 1 and isinstance(binds[0], ast.Call) else ""
    return ""


def _cut(s: Script, elts: list, drop: list, edits: Edits) -> None:
    """Remove the elements marked in `drop` from their list, each run of them at once: up
    to the next element, or from the end of the one before where the run ends the list."""
    i = 0
    while i < len(elts):
        if not drop[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(elts) and drop[j + 1]:
            j += 1
        if j + 1 < len(elts):
            edits.cut(s.start(elts[i]), s.start(elts[j + 1]))
        elif i > 0:
            edits.cut(s.end(elts[i - 1]), s.end(elts[j]))
        else:
            edits.cut(s.start(elts[i]), s.end(elts[j]))
        i = j + 1
