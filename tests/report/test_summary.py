"""The first change: which advice item the summary names."""

from types import SimpleNamespace

from bisect_pipeline.derive.findings import Checked, Finding
from bisect_pipeline.report.summary import first_item


def _item(kind: str, status=None, **numbers) -> Finding:
    return Finding(kind, "augment", kind, numbers, verified=Checked(status, 1.5) if status else None)


def test_a_refused_fix_or_one_that_changes_the_augmentation_is_never_the_first_change():
    augment = _item("device_augment", "helps", changes_augmentation=True, recommended={"fix": "device_augment"})
    refused = _item("device_tail", refused=True)
    assert first_item(SimpleNamespace(advice=(augment, refused))) is None
    tail = _item("device_tail", "helps", recommended={"fix": "device_tail"})
    assert first_item(SimpleNamespace(advice=(augment, refused, tail))) is tail
    prose = _item("augment")
    assert first_item(SimpleNamespace(advice=(augment, refused, prose))) is prose
