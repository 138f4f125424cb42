"""The context the advice's rules read: the pipeline's input-bound class from the verdict."""

import pytest

from bisect_pipeline.advise import context
from bisect_pipeline.core.results import Measurements
from bisect_pipeline.derive.verdict import Verdict
from bisect_pipeline.report import Report

BS = 16


@pytest.mark.parametrize("fraction,bottleneck,expected", [
    (0.0, "none", "not"), (0.30, "none", "not"),  # within noise: not input-bound whatever the estimate
    (0.049, "augment", "not"), (0.05, "augment", "moderately"), (0.199, "load", "moderately"),
    (0.20, "load", "highly"), (0.9, "inconclusive", "highly"), (None, None, None)])
def test_input_bound_class_thresholds(fraction, bottleneck, expected):
    v = Verdict(bottleneck, (), input_bound_fraction=fraction)
    r = Report(Measurements("cpu", BS, ()), verdict=v, points=())
    assert context.input_bound_class(r) == expected
    assert (context.INPUT_BOUND_MODERATE, context.INPUT_BOUND_HIGH) == (0.05, 0.20)
