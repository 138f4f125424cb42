"""A typed record and its JSON form, the base every module of records builds on
(results.py, isolated.py, trials.py): fields in the document's order, None left out
unless the document always carries the key (`to_dict`), read back from any version's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional


def plain(x: Any) -> Any:
    """The JSON form of a value: records as dicts, tuples as lists."""
    if isinstance(x, Record):
        return x.to_dict()
    if isinstance(x, (tuple, list)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class Record:
    """A typed value with a JSON form. `_nested` maps a field to the record type of its
    value (or of the items of its list); `_keep_none` names fields written even as None."""

    _nested: ClassVar[dict] = {}
    _keep_none: ClassVar[tuple] = ()

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None or f.name in self._keep_none:
                out[f.name] = plain(v)
        return out

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Any:
        """The record of a document's dict (None for None or {}); keys it does not know
        are left out (a document of another version)."""
        if not d:
            return None
        if isinstance(d, cls):
            return d
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            v, sub = d[f.name], cls._nested.get(f.name)
            if sub is not None and v is not None:
                v = tuple(sub.from_dict(x) for x in v) if isinstance(v, list) else sub.from_dict(v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class Part(Record):
    """One measurement that may not have been made: `status` ok, skipped, unavailable or
    failed, with its `reason` when not ok."""

    status: str = "ok"
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def missing(cls, status: str, reason: str) -> Any:
        return cls(status=status, reason=reason)
