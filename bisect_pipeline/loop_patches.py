"""The class-level patches through which an open loop.Session hears the user's code:
DataLoader.__init__ and __iter__ (frameworks build loaders of their own: Lightning
re-instantiates the user's, accelerate's DataLoaderShard calls its base loader's
__iter__), torchdata.nodes' Loader and BaseNode alike, argparse's parse_known_args, and
a global optimizer-step hook. Separate from the session because they are the process's,
not one session's: installed once while any session is open (SESSIONS), undone in a
forked worker, they pass each event to the innermost session unless its own code runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from .core import faults
from .pipeline.integrations import nodes, webdataset

SESSIONS: list = []  # open sessions (loop.Session), innermost last
_ORIGINAL: dict = {}


def _current() -> Any:
    return SESSIONS[-1] if SESSIONS else None


def _patched_init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL["init"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy:
        s.created(self)


def _patched_iter(self: DataLoader) -> Any:
    s = _current()
    if s is None or s.busy:
        return _ORIGINAL["iter"](self)
    if "webdataset" in sys.modules and self not in s.loop_stages:  # iterated by a WebLoader?
        s.loop_stages[self] = webdataset.loop_stages_of(self, sys._getframe(1))
    return s.iterate(self)


def _patched_graph_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """tn.Loader.__init__ and BaseNode.__init__: where a node graph's loader (a Loader, a
    root node) was created."""
    _ORIGINAL["loader init" if nodes.is_loader(self) else "node init"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy and type(self).__name__ != "LoaderIterator":
        s.created(self)


def _patched_loader_iter(self: Any) -> Any:
    s = _current()
    if s is None or s.busy or sys._getframe(1).f_code.co_name == "state_dict":  # (Loader.state_dict's own iter())
        return _ORIGINAL["loader iter"](self)
    return s.iterate(self)


def _patched_node_iter(self: Any) -> Any:
    """BaseNode.__iter__ (it returns the node): a root node the loop iterates itself."""
    s = _current()
    if s is None or s.busy or type(self).__name__ == "LoaderIterator":
        return self
    return s.iterate(self)


def _on_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    s = _current()
    if s is not None and not s.busy:
        s.optimizer_stepped(optimizer)


def _patched_parse_known_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
    out = _ORIGINAL["parse"](self, *args, **kwargs)
    s = _current()
    if s is not None and not s.busy and isinstance(out, tuple) and out:
        s.parsed(out[0])
    return out


def install() -> None:
    if _ORIGINAL:
        return
    _ORIGINAL.update(init=DataLoader.__init__, iter=DataLoader.__iter__,
                     parse=argparse.ArgumentParser.parse_known_args,
                     hook=register_optimizer_step_post_hook(_on_optimizer_step),
                     undo=faults.undo_in_child(_forget_in_child))
    DataLoader.__init__ = _patched_init
    DataLoader.__iter__ = _patched_iter
    argparse.ArgumentParser.parse_known_args = _patched_parse_known_args
    tn = _torchdata_nodes()
    if tn is not None:
        _ORIGINAL.update({"loader init": tn.Loader.__init__, "loader iter": tn.Loader.__iter__,
                          "node init": tn.BaseNode.__init__, "node iter": tn.BaseNode.__iter__})
        tn.Loader.__init__ = _patched_graph_init
        tn.Loader.__iter__ = _patched_loader_iter
        tn.BaseNode.__init__ = _patched_graph_init
        tn.BaseNode.__iter__ = _patched_node_iter


def _torchdata_nodes() -> Any:
    """torchdata.nodes where it is installed (patched like DataLoader), else None."""
    try:
        if importlib.util.find_spec("torchdata") is None:
            return None
        import torchdata.nodes as tn
    except Exception:  # a broken install: its loaders are then iterated as they are
        return None
    return tn


def uninstall() -> None:
    if not _ORIGINAL or SESSIONS:
        return
    DataLoader.__init__ = _ORIGINAL.pop("init")
    DataLoader.__iter__ = _ORIGINAL.pop("iter")
    argparse.ArgumentParser.parse_known_args = _ORIGINAL.pop("parse")
    if "loader init" in _ORIGINAL:
        tn = _torchdata_nodes()
        tn.Loader.__init__, tn.Loader.__iter__ = _ORIGINAL.pop("loader init"), _ORIGINAL.pop("loader iter")
        tn.BaseNode.__init__, tn.BaseNode.__iter__ = _ORIGINAL.pop("node init"), _ORIGINAL.pop("node iter")
    _ORIGINAL.pop("hook").remove()
    faults.forget_in_child(_ORIGINAL.pop("undo"))


def _forget_in_child() -> None:
    """In a process forked from the session's (a DataLoader worker): the patches and
    os._exit as they were before any session, and no session open."""
    if SESSIONS and SESSIONS[0]._exit is not None:
        os._exit = SESSIONS[0]._exit
    SESSIONS.clear()
    uninstall()


def real_iter(loader: Any) -> Any:
    """The loader's own iterator, patched or not (a root node is its own iterator), its
    workers or threads started whole (faults.signals_held): a Ctrl-C meanwhile is raised
    once they are (a DataLoader iterator so dropped shuts its workers down)."""
    if nodes.is_node(loader) and not nodes.is_loader(loader):
        return loader
    with faults.signals_held():
        if nodes.is_loader(loader):
            return _ORIGINAL.get("loader iter", type(loader).__iter__)(loader)
        return _ORIGINAL.get("iter", DataLoader.__iter__)(loader)
