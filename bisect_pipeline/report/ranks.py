"""The job's report under torchrun: every rank's result together, the straggler named,
the verdict of the rank that sets the pace (distributed.py measures; this is pure)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from tabulate import tabulate

from ..derive.drops import POINTS
from .model import Report

# A rank is a straggler when its loop waits for data at `full` for at least this share
# of the time per batch (the verdict's own "real drop" floor, stats.MIN_REL_DROP)...
STRAGGLER_MIN_WAIT_SHARE = 0.05
# ...and for at least this share of the longest wait of any rank (ranks with about the
# same stall are named together).
STRAGGLER_REL_TO_MAX = 0.5


def stragglers(waits: list) -> list:
    """Ranks whose loop waits for data at `full`: `waits` holds each rank's
    (wait seconds per batch, seconds per batch) or None."""
    shares = [(w / t if w is not None and t else 0.0) for w, t in (x or (None, None) for x in waits)]
    top = max(shares, default=0.0)
    if top < STRAGGLER_MIN_WAIT_SHARE:
        return []
    return [r for r, s in enumerate(shares) if s >= STRAGGLER_REL_TO_MAX * top]


def combine(local: Report, gathered: Any, rank: int) -> "DistributedReport":
    """The report of the whole job on every rank, from every surviving rank's document
    (distributed.gather_reports: a Gathered): the verdict of the rank that sets the pace.
    Only the writer (rank 0, or the lowest surviving rank when rank 0 was lost) prints or
    writes it (the CLI)."""
    docs = list(gathered.docs)
    full = []
    for d in docs:
        p = next((p for p in d["report"]["points"] if p["point"] == "full"), None)
        w = d["input_wait_ms_per_batch"].get("full")
        full.append((w, p["ms_per_batch"]) if p and p["status"] == "ok" and w is not None else None)
    slow = stragglers(full)
    at = slow[0] if len(slow) == 1 else (max(slow, key=lambda i: full[i][0]) if slow else _slowest_full(docs))
    pace = docs[at]["rank"]
    base = local if pace == rank else Report.from_dict(docs[at]["report"])
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Report)}
    out = DistributedReport(**fields, world_size=gathered.world_size or len(docs), rank=rank, ranks=tuple(docs),
                            pace_rank=pace, straggler_ranks=tuple(docs[i]["rank"] for i in slow),
                            writer=gathered.writer, lost_ranks=tuple(gathered.lost),
                            stopped_by=tuple(sorted(gathered.signals.items())), lost_error=gathered.error,
                            stopped_how=gathered.how)
    return dataclasses.replace(out, summary=f"{out.who()} {base.summary}")


def _slowest_full(docs: list) -> int:
    def tp(d: dict) -> float:
        p = next((p for p in d["report"]["points"] if p["point"] == "full"), None)
        return p["samples_per_sec"] if p and p["samples_per_sec"] is not None else math.inf
    return min(range(len(docs)), key=lambda r: tp(docs[r]))


def _point_table(docs: list) -> list:
    rows = []
    for name in POINTS:
        vals = []
        for d in docs:
            p = next((p for p in d["report"]["points"] if p["point"] == name), None)
            if p and p["status"] == "ok" and p["samples_per_sec"] is not None:
                vals.append((p["samples_per_sec"], d["rank"]))
        if not vals:
            rows.append({"point": name, "median_samples_per_sec": None, "slowest_samples_per_sec": None,
                         "slowest_rank": None, "ranks_ok": 0})
            continue
        s = sorted(v for v, _ in vals)
        mid = len(s) // 2
        median = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
        slowest = min(vals)
        rows.append({"point": name, "median_samples_per_sec": round(median, 1),
                     "slowest_samples_per_sec": slowest[0], "slowest_rank": slowest[1], "ranks_ok": len(vals)})
    return rows


@dataclasses.dataclass(frozen=True)
class DistributedReport(Report):
    """A Report for the whole job: the verdict is that of the rank that sets the pace
    (`pace_rank`); `ranks` holds every rank's own result."""

    world_size: int = 1
    rank: int = 0
    ranks: tuple = ()  # the surviving ranks' documents
    pace_rank: Optional[int] = None
    straggler_ranks: tuple = ()
    writer: int = 0  # the rank that prints and writes the job's report
    lost_ranks: tuple = ()  # board.Board.lost's entries: rank, host, pid, exit_code, signal, how
    stopped_by: tuple = ()  # (rank, signal name): the signals that stopped the run
    lost_error: Optional[str] = None  # the collective that failed when a rank was lost
    stopped_how: Optional[str] = None  # how the run stopped (distributed.Stopped.how), when it did

    def to_dict(self) -> dict:
        doc = Report.to_dict(self)
        doc["world_size"] = self.world_size
        doc["ranks"] = [dict(d) for d in self.ranks]
        doc["distributed"] = {
            "pace_rank": self.pace_rank,
            "straggler_ranks": list(self.straggler_ranks),
            "straggler_rule": (f"a rank whose loop waits for its next batch at `full` for >= "
                               f"{STRAGGLER_MIN_WAIT_SHARE:.0%} of its time per batch, and >= "
                               f"{STRAGGLER_REL_TO_MAX:.0%} of the longest wait of any rank"),
            "points": _point_table(self.ranks),
            "written_by": self.writer,
            "lost_ranks": [dict(r) for r in self.lost_ranks],
            "stopped_by": [{"rank": r, "signal": sig} for r, sig in self.stopped_by],
            "stopped_how": self.stopped_how,
        }
        if self.lost_error:
            doc["distributed"]["lost_error"] = self.lost_error
        return doc

    def who(self) -> str:
        return " ".join(x for x in (self._lost(), self._pace()) if x)

    def _lost(self) -> str:
        """The ranks lost and the signals that stopped the run, first."""
        out = [f"[{self.world_size} ranks] rank {r['rank']} was lost mid-run: {r['how']}." for r in self.lost_ranks]
        if self.stopped_by and not self.lost_ranks:  # a lost rank's launcher stops the others: the loss is the news
            by = "; ".join(f"{sig} on rank {r}" for r, sig in self.stopped_by)
            out.append(f"[{self.world_size} ranks] {by}: {self.stopped_how or 'stopped'}.")
        if out:
            alive = ", ".join(str(d["rank"]) for d in self.ranks)
            out.append(f"What rank(s) {alive} measured until then is kept (written by rank {self.writer}); rank "
                       f"{self.pace_rank}'s report follows.")
        return " ".join(out)

    def _pace(self) -> str:
        if self.lost_ranks or self.stopped_by:
            return ""  # an interrupted run: no pace to name
        if self.straggler_ranks:
            names = ", ".join(str(r) for r in self.straggler_ranks)
            return (f"[{self.world_size} ranks] straggler rank(s) {names}: its input pipeline sets the pace of "
                    f"every rank; rank {self.pace_rank}'s verdict follows.")
        return (f"[{self.world_size} ranks] no rank waits for its data at full; verdict of rank "
                f"{self.pace_rank} (the slowest at full).")

    def text(self, *, breakdown: str = "bottleneck") -> str:
        """The summary first (its verdict names the rank that sets the pace), then every
        rank's figures, then the rest of that rank's report."""
        rows = []
        for r in _point_table(self.ranks):
            rows.append([r["point"], _fmt(r["median_samples_per_sec"]), _fmt(r["slowest_samples_per_sec"]),
                         "-" if r["slowest_rank"] is None else r["slowest_rank"]])
        waits = [[d["rank"], _fmt(d["input_wait_ms_per_batch"].get("full"), 2),
                  d["report"]["bottleneck"] or "-"] for d in self.ranks]
        summary, _, rest = Report.text(self, breakdown=breakdown).partition("\n\n")
        lost = [f"  lost: rank {r['rank']}" + (f" on {r['host']}" if r.get("host") else "")
                + (f" (pid {r['pid']})" if r.get("pid") else "") + f": {r['how']}" for r in self.lost_ranks]
        return "\n".join([
            summary,
            "",
            f"torch.distributed: world size {self.world_size}, lockstep (rank 0 decides window lengths)",
            *lost,
            "",
            tabulate(rows, headers=["point", "median samples/s", "slowest samples/s", "slowest rank"],
                     disable_numparse=True, colalign=("left", "right", "right", "right")),
            "",
            tabulate(waits, headers=["rank", "waits for data at full (ms/batch)", "own verdict"],
                     disable_numparse=True, colalign=("right", "right", "left")),
            "",
            rest,
        ])


def _fmt(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"
