"""Loading the user's workload from --entry MODULE:FUNCTION or path/to/file.py:FUNCTION
(entry.py): its code runs; every mistake is one clear BisectError with the contract."""

import sys
import textwrap

import pytest

from bisect_pipeline import BisectError, Workload
from bisect_pipeline.pipeline import entry

ENTRY = textwrap.dedent("""
    from conftest import planted

    def make():
        return planted("augment", 0)

    def make_bad():
        return 3

    def make_raises():
        raise ValueError("no data here")

    def needs_args(x):
        return x

    VALUE = 1
""")


@pytest.fixture
def here(tmp_path, monkeypatch):
    (tmp_path / "user_entry.py").write_text(ENTRY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    return tmp_path


def test_a_module_or_a_file_gives_the_workload(here):
    wl = entry.load("user_entry:make")
    assert isinstance(wl, Workload) and wl.model is not None
    assert isinstance(entry.load(f"{here / 'user_entry.py'}:make"), Workload)
    assert callable(entry.resolve("user_entry.py:make"))  # resolved, not called


@pytest.mark.parametrize("spec,needle", [
    ("no-colon", "MODULE:FUNCTION"),
    ("nosuchmod:make", "no module named 'nosuchmod'"),
    ("missing.py:make", "no file"),
    ("user_entry.py:nothing", "has no attribute 'nothing' (callables there: make, make_bad"),
    ("user_entry.py:VALUE", "is a int, not a function"),
    ("user_entry.py:make_bad", "returned int"),
    ("user_entry.py:make_raises", "raised ValueError: no data here"),
    ("user_entry.py:needs_args", "calling it without arguments failed"),
])
def test_every_mistake_is_one_clear_error_with_the_contract(here, spec, needle):
    with pytest.raises(BisectError) as err:
        entry.load(spec)
    assert needle in str(err.value)
    assert any(w in str(err.value) for w in ("FUNCTION", "Workload", "Fix the entry function"))  # what to do
