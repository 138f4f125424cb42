"""The change itself: loader settings written against the user's script (`--patch`).

Given the script's source and the line where its training loader was created
(loop_loaders.Seen.created_at), `make` finds the call there (script_ast.py) and says, setting by
setting, how to get the new value:

- a keyword of the call, changed or added (`num_workers=2` -> `num_workers=1`), or the
  place its value comes from: a constant assigned once in the same scope, a literal dict
  passed as `**kwargs` (or, where that cannot be told, `**dict(kwargs, num_workers=1)`),
  the `__init__` parameter behind `self.num_workers` and the call that builds the object;
- a flag of the script's own command line where the value is `args.workers` (or
  `int(opt.workers)`) and an `add_argument` call of the script defines that dest: the
  flag to rerun with (`-j 1`) instead of a diff;
- for a loader built by Hugging Face's Trainer, its `TrainingArguments(...)`
  (`dataloader_num_workers`), or the flag `HfArgumentParser` makes of it;
- the step's threads as a `torch.set_num_threads(N)` line at the top of `main()` (or
  after the imports), or the call already there changed; an environment variable as the
  command's prefix.

Each rewrite writes its spans into one Edits and returns its Changes (edits.py), the
spans making one diff; a rewrite of another kind does the same, in a module of its own
called from `make`. Pure: it reads the source it is given and writes nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import shlex
from typing import Any, ClassVar, Optional

from ..core.fixes import DECODE
from ..core.results import Record
from .edits import Change, Edits
from . import patch_decode, patch_tail
from .outcome import FIX, THREADS
from .script_ast import (LOADER_KEYS, Script, accepts_loader_keywords, after_imports, find_call, is_docstring,
                         name_of, uses)

ENV = "env"
# Hugging Face TrainingArguments: the loader's settings under their names there.
HF_NAMES = {"num_workers": "dataloader_num_workers", "pin_memory": "dataloader_pin_memory",
            "persistent_workers": "dataloader_persistent_workers", "prefetch_factor": "dataloader_prefetch_factor"}
# Calls that pass their value through unchanged: `int(args.workers)` is the flag's value.
_CONVERSIONS = ("int", "bool", "str")
# How deep `self.x` -> `__init__(x=...)` -> `Module(x=args.x)` is followed.
_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class Patch(Record):
    """The change for one script: the diff, the flags, the environment, each setting's
    Change, and `reason` when no part of it could be written."""

    _nested: ClassVar[dict] = {"changes": Change}
    path: Optional[str] = None
    line: Optional[int] = None
    call: Optional[str] = None
    diff: str = ""
    flags: tuple = ()  # the tokens to add to the script's command line, e.g. ("-j", "1")
    env: Optional[dict] = None
    changes: tuple = ()
    reason: Optional[str] = None

    @property
    def empty(self) -> bool:
        return not (self.diff or self.flags or self.env)

    def command(self, argv: Optional[list] = None) -> str:
        """The command to rerun with: env prefix, the flags (replacing the same flags in
        `argv`, the script and its arguments as run)."""
        words = ["python", *with_flags(list(argv), self.changes)] if argv else list(self.flags)
        env = [f"{k}={shlex.quote(str(v))}" for k, v in (self.env or {}).items()]
        return " ".join(env + [shlex.quote(w) for w in words])


@dataclasses.dataclass(frozen=True)
class _Setting:
    """One setting to give: its name where it is written, the new value, and the value
    the loader has as the script ran (None: not known)."""

    name: str
    value: Any
    current: Any = None


def make(source: str, *, path: str, line: Optional[int], settings: dict, current: Optional[dict] = None,
         display: Optional[str] = None, fix: Optional[dict] = None) -> Patch:
    """The Patch that gives the script `settings` (LOADER_KEYS, THREADS, ENV, FIX). `current`:
    the settings the loader has as the script ran (a constant that disagrees is not where
    the value comes from); `display`: the path written in the diff (default `path`); `fix`:
    the Fix (its JSON form) of settings' FIX, as the check built it (patch_tail.py,
    patch_decode.py)."""
    name = display or path
    base = Patch(path=name, line=line)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return dataclasses.replace(base, reason=f"{name} could not be parsed ({exc.msg}, line {exc.lineno})")
    s = Script(source, tree, name)
    call = find_call(s, line) if line else None
    edits = Edits(s)
    changes: list = []
    loader = {k: settings[k] for k in LOADER_KEYS if k in settings}
    if loader:
        if call is None:
            why = f"no call at {name}:{line}" if line else "where the loader was created is not known"
            changes += [Change(k, v, "not applied", None, why) for k, v in loader.items()]
        else:
            changes += _loader_changes(s, call, loader, current or {}, edits)
    if THREADS in settings:
        changes.append(_threads(s, int(settings[THREADS]), edits))
    if settings.get(FIX):
        rewrite = patch_decode.rewrite if settings[FIX] == DECODE else patch_tail.rewrite
        changes.append(rewrite(s, dict(fix or {}, kind=settings[FIX]), edits))
    env = dict(settings[ENV]) if settings.get(ENV) else None
    if env:
        changes.append(Change(ENV, env, "env", None, "start it with " + " ".join(f"{k}={v}" for k, v in env.items())))
    flags = tuple(t for c in changes if c.how == "flag" for t in c.tokens)
    patch = dataclasses.replace(base, call=None if call is None else s.text(call.func), diff=edits.diff(name),
                                flags=flags, env=env, changes=tuple(changes))
    if patch.empty and all(c.how == "not applied" for c in changes) and changes:
        patch = dataclasses.replace(patch, reason=changes[0].text)
    return patch


def _loader_changes(s: Script, call: ast.Call, loader: dict, current: dict, edits: Edits) -> list:
    """Each loader setting applied to the call, or to Hugging Face's TrainingArguments when
    the line is a Trainer's (no loader keyword there)."""
    target, names = call, {k: k for k in loader}
    if not accepts_loader_keywords(s, call) and not any(k.arg in LOADER_KEYS or k.arg is None for k in call.keywords):
        hf = _hf_arguments(s)
        if hf is not None:
            target, names = hf, HF_NAMES
        elif uses(s.tree, "HfArgumentParser"):
            return [_hf_flag(k, v) for k, v in loader.items()]
    out, adds = [], {}
    for key, value in loader.items():
        name = names.get(key)
        if name is None:
            out.append(Change(key, value, "not applied", s.where(target), f"{name_of(target.func)} has no {key}"))
            continue
        can_add = target is not call or accepts_loader_keywords(s, call)
        change = _keyword(s, target, _Setting(name, value, current.get(key)), edits, can_add)
        if change is None:  # neither in the call nor in its **kwargs: added to the call
            if not can_add:
                out.append(Change(key, value, "not applied", s.where(call),
                                  f"{name_of(call.func)}(...) does not show {key}: set it where it builds the loader"))
                continue
            adds[name] = value
            change = Change(key, value, "keyword", s.where(target), f"{name}={value!r} added")
        out.append(dataclasses.replace(change, setting=key))
    if adds:
        edits.add(target, adds)
    return out


def _keyword(s: Script, call: ast.Call, st: _Setting, edits: Edits, can_add: bool = True) -> Optional[Change]:
    """The setting where the call's keyword `name` (or its **kwargs) gives it; None when
    neither does (or, for a call that may not take it, `can_add` False, when only a
    `**dict(kwargs, name=value)` would)."""
    name, value = st.name, st.value
    kw = next((k for k in call.keywords if k.arg == name), None)
    if kw is not None:
        return _assign(s, kw.value, st, edits)
    starred = [k for k in call.keywords if k.arg is None]
    if not starred:
        return None
    found = [(src, e) for k in starred for src, e in _dict_sources(s, k.value, call) if e is not None and src == name]
    if len(found) == 1:
        change = _assign(s, found[0][1], st, edits, strict=True)
        if change is not None:
            return change
    if not can_add:
        return None
    edits.wrap(starred[-1].value, name, value)
    return Change(name, value, "keyword", s.where(starred[-1].value),
                  f"**{s.text(starred[-1].value)} given {name}={value!r}")


def _assign(s: Script, expr: ast.AST, st: _Setting, edits: Edits, depth: int = 0, *,
            strict: bool = False) -> Optional[Change]:
    """Give the expression that sets `name` the new value: a flag for `args.x`, the place
    a name or `self.x` comes from, else the expression itself replaced by the literal.
    `strict`: None where a constant there disagrees with `current` (not in effect)."""
    where, name, value = s.where(expr), st.name, st.value
    if isinstance(expr, ast.Constant):
        if st.current is not None and expr.value != st.current and strict:
            return None
        if expr.value == value and type(expr.value) is type(value):
            return Change(name, value, "unchanged", where, f"{name}={value!r} already")
    else:
        inner = _unwrapped(expr)
        found = (_flag(s, inner, st) or _from_name(s, inner, st, edits, depth)
                 or _from_self(s, inner, st, edits, depth)) if depth < _DEPTH else None
        if found is not None or strict:
            return found
    edits.replace(expr, repr(value))
    return Change(name, value, "keyword", where, f"{name}={s.text(expr)} -> {value!r}")


def _unwrapped(expr: ast.AST) -> ast.AST:
    """`int(args.workers)` -> `args.workers`."""
    while (isinstance(expr, ast.Call) and name_of(expr.func) in _CONVERSIONS and len(expr.args) == 1
           and not expr.keywords):
        expr = expr.args[0]
    return expr


def _flag(s: Script, expr: ast.AST, st: _Setting) -> Optional[Change]:
    """`args.workers` where the script's parser defines dest `workers`: rerun with its flag."""
    name, value = st.name, st.value
    if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)):
        return None
    flag = s.flags.get(expr.attr)
    tokens = flag.tokens(value) if flag is not None else None
    if tokens is None:
        return None
    others = sum(1 for n in ast.walk(s.tree) if isinstance(n, ast.Attribute) and n.attr == expr.attr
                 and isinstance(n.value, ast.Name) and n.value.id == expr.value.id and n is not expr)
    also = f" (it also sets the {others} other use(s) of {s.text(expr)} in the script)" if others else ""
    aliases = flag.options + tuple("--no-" + o[2:] for o in flag.options
                                   if o.startswith("--") and flag.action == "boolean_optional")
    return Change(name, value, "flag", s.where(expr),
                  f"{name}={s.text(expr)}{also}: rerun with {' '.join(shlex.quote(t) for t in tokens)}", tokens, aliases)


def _from_name(s: Script, expr: ast.AST, st: _Setting, edits: Edits, depth: int) -> Optional[Change]:
    """A name assigned once in its scope (`NUM_WORKERS = 4`): that assignment."""
    if not isinstance(expr, ast.Name):
        return None
    scope = s.enclosing(expr, (ast.FunctionDef, ast.AsyncFunctionDef)) or s.tree
    stores = [n for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
              and any(isinstance(t, ast.Name) and t.id == expr.id for t in _targets(n))]
    if len(stores) != 1 or isinstance(stores[0], ast.AugAssign) or stores[0].value is None:
        return None
    if isinstance(stores[0], ast.Assign) and len(stores[0].targets) != 1:
        return None
    return _assign(s, stores[0].value, st, edits, depth + 1, strict=True)


def _targets(node: ast.AST) -> list:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _from_self(s: Script, expr: ast.AST, st: _Setting, edits: Edits, depth: int) -> Optional[Change]:
    """`self.num_workers` (or `self.hparams.num_workers`) set from an `__init__` parameter:
    the argument of the one call in the script that builds the class, added there when
    absent; else the parameter's default."""
    name, value = st.name, st.value
    attr = _self_attr(expr)
    cls = s.enclosing(expr, (ast.ClassDef,)) if attr else None
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if cls else None
    if init is None:
        return None
    param = _param_of(init, attr)
    if param is None:
        return None
    builds = [n for n in ast.walk(s.tree) if isinstance(n, ast.Call) and name_of(n.func) == cls.name]
    params = [a.arg for a in init.args.args[1:]]
    if len(builds) == 1:
        b = builds[0]
        kw = next((k for k in b.keywords if k.arg == param), None)
        i = params.index(param) if param in params else None
        arg = kw.value if kw is not None else (b.args[i] if i is not None and i < len(b.args) else None)
        if arg is not None:
            return _assign(s, arg, st, edits, depth + 1)
        if not any(k.arg is None for k in b.keywords):
            edits.add(b, {param: value})
            return Change(name, value, "keyword", s.where(b), f"{cls.name}({param}={value!r}) added")
    if not builds and uses(s.tree, "LightningCLI"):  # the CLI builds it: its flag
        group = "data" if any("DataModule" in name_of(b) for b in cls.bases) else "model"
        tokens = (f"--{group}.{param}", repr(value))
        return Change(name, value, "flag", s.where(expr), f"{name}={s.text(expr)} (LightningCLI, {cls.name}): rerun "
                      f"with {' '.join(tokens)}", tokens, (tokens[0],))
    default = _default_of(init, param)
    return None if default is None else _assign(s, default, st, edits, depth + 1)


def _self_attr(expr: ast.AST) -> Optional[str]:
    if not isinstance(expr, ast.Attribute):
        return None
    v = expr.value
    if isinstance(v, ast.Name) and v.id == "self":
        return expr.attr
    if isinstance(v, ast.Attribute) and v.attr == "hparams" and isinstance(v.value, ast.Name) and v.value.id == "self":
        return expr.attr
    return None


def _param_of(init: ast.FunctionDef, attr: str) -> Optional[str]:
    """The `__init__` parameter `self.<attr>` holds: `self.attr = param`, or a parameter
    of that name (save_hyperparameters)."""
    names = {a.arg for a in init.args.args + init.args.kwonlyargs}
    for n in ast.walk(init):
        if isinstance(n, ast.Assign) and any(_self_attr(t) == attr for t in n.targets):
            v = _unwrapped(n.value)
            return v.id if isinstance(v, ast.Name) and v.id in names else None
    return attr if attr in names else None


def _default_of(fn: ast.FunctionDef, param: str) -> Optional[ast.AST]:
    pos = fn.args.args
    defaults = dict(zip([a.arg for a in pos[len(pos) - len(fn.args.defaults):]], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    return defaults.get(param)


def _dict_sources(s: Script, expr: ast.AST, call: ast.Call) -> list:
    """(key, value) of the literal dicts a `**name` is built from in its scope: `name =
    {...}` or `dict(...)`, `name.update(...)` of those or of another such name, `name[k] = v`;
    (None, None) for a part that cannot be read (the key may be anywhere)."""
    if not isinstance(expr, ast.Name):
        return [(None, None)]
    scope = s.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef)) or s.tree
    out: list = []
    for n in ast.walk(scope):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets):
            out += _literal_items(n.value)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update"
              and isinstance(n.func.value, ast.Name) and n.func.value.id == expr.id):
            for a in n.args:
                out += _literal_items(a) if not isinstance(a, ast.Name) else _dict_sources(s, a, call)
            out += [(k.arg, k.value) for k in n.keywords]
        elif (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript)
              and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == expr.id):
            key = n.targets[0].slice
            out.append((key.value, n.value) if isinstance(key, ast.Constant) else (None, None))
    return out


def _literal_items(node: ast.AST) -> list:
    if isinstance(node, ast.Dict):
        return [(k.value, v) if isinstance(k, ast.Constant) else (None, None) for k, v in zip(node.keys, node.values)]
    if isinstance(node, ast.Call) and name_of(node.func) == "dict":
        return [(k.arg, k.value) for k in node.keywords] + [(None, None) for _ in node.args]
    return [(None, None)]


def _hf_arguments(s: Script) -> Optional[ast.Call]:
    calls = [n for n in ast.walk(s.tree) if isinstance(n, ast.Call) and name_of(n.func).endswith("TrainingArguments")]
    return calls[0] if len(calls) == 1 else None


def _hf_flag(key: str, value: Any) -> Change:
    name = HF_NAMES.get(key)
    if name is None:
        return Change(key, value, "not applied", None, f"TrainingArguments has no {key}")
    tokens = (f"--{name}", repr(value))
    return Change(key, value, "flag", None, f"{name} (HfArgumentParser): rerun with {' '.join(tokens)}", tokens,
                  (f"--{name}", f"--{name.replace('_', '-')}"))


def _threads(s: Script, n: int, edits: Edits) -> Change:
    """The step's threads: the script's own set_num_threads call changed, else the line
    added at the top of `main()`, else after the module's imports."""
    calls = [c for c in ast.walk(s.tree) if isinstance(c, ast.Call) and name_of(c.func) == "set_num_threads"
             and len(c.args) == 1]
    if len(calls) == 1:
        change = _assign(s, calls[0].args[0], _Setting(THREADS, n), edits)
        return dataclasses.replace(change, setting=THREADS)
    torch_name = _torch_alias(s.tree)
    main = next((f for f in s.tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"), None)
    body = [b for b in (main.body if main else []) if not is_docstring(b)]
    importing = [] if torch_name else ["import torch"]
    lines = importing + [f"{torch_name or 'torch'}.set_num_threads({n})"]
    if body and body[0].lineno > main.lineno:
        at, indent = body[0].lineno, s.indent(body[0].lineno)
        edits.insert_lines(at, [indent + x for x in lines])
        return Change(THREADS, n, "lines", f"{s.path}:{at}", f"torch.set_num_threads({n}) at the top of main()")
    at = after_imports(s.tree)
    edits.insert_lines(at, lines)
    return Change(THREADS, n, "lines", f"{s.path}:{at}", f"torch.set_num_threads({n}) after the imports")


def _torch_alias(tree: ast.Module) -> Optional[str]:
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or (a.name.startswith("torch.") and a.asname is None):
                    return a.asname or "torch"
    return None


def with_flags(argv: list, changes: tuple) -> list:
    """The script's command line (script and arguments) with the flags of `changes` set:
    every spelling of each taken out of `argv` where it is already (`-j 2`, `-j2`,
    `--workers=2`, with its value), then the new tokens added at the end."""
    flags = [c for c in changes if c.how == "flag" and c.tokens]
    out: list = list(argv[:1])
    rest = list(argv[1:])
    i = 0
    while i < len(rest):
        tok = rest[i]
        hit = next((c for c in flags if _spells(tok, c)), None)
        if hit is None:
            out.append(tok)
        elif tok in hit.aliases and len(hit.tokens) == 2:
            i += 1  # its value goes with it
        i += 1
    return out + [t for c in flags for t in c.tokens]


def _spells(tok: str, c: Change) -> bool:
    """Whether `tok` sets the flag of `c`: an alias, `--alias=value`, or `-jVALUE`."""
    if tok in c.aliases:
        return True
    if len(c.tokens) != 2:
        return False
    return any(tok.startswith(a + "=") or (len(a) == 2 and a[1] != "-" and tok.startswith(a) and len(tok) > 2)
               for a in c.aliases)
