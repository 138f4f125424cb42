"""Holding glibc's malloc still: detection, the settings, what a run records, and the
step timed before and after (planted costs on a fake clock)."""

from __future__ import annotations

import platform

import pytest

from bisect_pipeline.measure import allocator
from bisect_pipeline.measure.allocator import AFTER, HELD, Held, Settings, after_settings
from conftest import FakeClock

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


class FakeGlibc:
    """Records the settings applied; `held` says whether HELD is the current one."""

    def __init__(self):
        self.applied: list = []
        self.released = 0

    def apply(self, s: Settings) -> bool:
        self.applied.append(s)
        return True

    def release(self) -> None:
        self.released += 1

    @property
    def held(self) -> bool:
        return bool(self.applied) and self.applied[-1] == HELD


@pytest.fixture
def fake(monkeypatch):
    g = FakeGlibc()
    monkeypatch.setattr(allocator, "find", lambda: (g, "glibc (fake)"))
    return g


def planted_step(g: FakeGlibc, clock: FakeClock, default_ms: float, held_ms: float):
    def step():
        clock.t += (held_ms if g.held else default_ms) / 1e3
    return step


def test_the_step_timed_before_and_after_gives_a_real_cost(fake):
    clock = FakeClock()
    h = Held()
    out = h.time_step(planted_step(fake, clock, 21.0, 15.0), budget_s=0.5, clock=clock).to_dict()
    assert out["status"] == "ok" and out["real"]
    assert (out["default_ms_per_batch"], out["held_ms_per_batch"]) == (21.0, 15.0)
    assert out["cost_ms_per_batch"] == pytest.approx(6.0)
    assert h.holding and fake.applied == [HELD]  # held from then on
    assert min(out["steps"]) >= allocator.BLOCK_STEPS


def test_a_step_that_costs_the_same_is_not_a_finding(fake):
    clock = FakeClock()
    out = Held().time_step(planted_step(fake, clock, 15.2, 15.0), budget_s=0.5, clock=clock).to_dict()
    assert out["status"] == "ok" and not out["real"]  # 0.2 ms is under 5% of the step


def test_release_sets_the_after_settings_and_gives_memory_back(fake, monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    h = Held()
    assert h.hold()
    h.release()
    assert fake.applied == [HELD, AFTER] and fake.released == 1
    d = h.record().to_dict()
    assert d["controlled"] and d["during"] == HELD.to_dict() and d["after"] == AFTER.to_dict()


def test_the_users_malloc_variables_are_put_back():
    env = {"MALLOC_TRIM_THRESHOLD_": "1048576", "MALLOC_TOP_PAD_": "bogus"}
    s = after_settings(env)
    assert s.trim_threshold == 1048576  # the user's value
    assert s.top_pad == AFTER.top_pad and s.mmap_threshold == AFTER.mmap_threshold  # unset or unreadable


def test_elsewhere_nothing_is_changed_and_the_run_says_why(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    h = Held()
    assert not h.hold()
    d = h.record().to_dict()
    assert d == {"controlled": False, "allocator": d["allocator"], "reason": d["reason"]}
    assert "Darwin" in d["reason"]
    assert h.time_step(lambda: None, 0.1, FakeClock()).status == "skipped"


def test_a_preloaded_allocator_is_left_alone(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    g, why = allocator.find()
    assert g is None and "jemalloc" in why


def test_turned_off_changes_nothing(fake):
    h = Held(enabled=False)
    assert not h.hold() and fake.applied == []
    assert "turned off" in h.record().to_dict()["reason"]


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt is only on Linux with glibc")
def test_real_glibc_accepts_the_settings():
    g, where = allocator.find()
    assert g is not None and where.startswith("glibc")
    try:
        assert g.apply(HELD)
    finally:
        g.apply(after_settings())
        g.release()


EXE = "/usr/bin/python3.12"
MAPS = """\
00400000-00420000 r--p 00000000 08:01 1234      /usr/bin/python3.12
00420000-00700000 r-xp 00020000 08:01 1234      /usr/bin/python3.12
7f0000000000-7f0000200000 r-xp 00028000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 r-xp 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
"""


def test_a_non_pie_executables_plt_entry_is_glibcs_malloc_when_no_other_allocator_is_loaded():
    # Ubuntu's python3 is not position-independent: dlsym gives the executable's PLT entry
    # (0x420620 on an H200 machine), not libc's malloc; that is still glibc's malloc
    without_jemalloc = "\n".join(line for line in MAPS.splitlines() if "jemalloc" not in line)
    assert allocator.other_malloc(0x420620, 0x7F0000010000, without_jemalloc, EXE) is None
    assert "jemalloc" in allocator.other_malloc(0x420620, 0x7F0000010000, MAPS, EXE)


def test_malloc_defined_by_another_library_is_left_alone():
    why = allocator.other_malloc(0x7F0000600100, 0x7F0000010000, MAPS, EXE)
    assert why and "libjemalloc.so.2" in why
    assert allocator.other_malloc(0x7F0000010000, 0x7F0000010000, MAPS, EXE) is None  # the same function
