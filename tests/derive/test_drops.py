"""The drops between the points (drops.py) on planted noise: a stage's drop and a lead
with their noise, exact values."""

import math

import pytest

from bisect_pipeline.core.stats import FEW_ROUNDS, Contrast
from bisect_pipeline.derive.drops import StageCost, drop, leads


class OneContrast:
    """A noise.Noise stand-in whose every contrast is `c` (the noise of a lead, planted)."""

    def __init__(self, c: Contrast) -> None:
        self.c = c

    def contrast(self, coef):
        return self.c

    def time(self, point):
        return 0.0


def test_a_runner_up_whose_upper_bound_is_under_the_leader_s_lower_bound_is_behind():
    # the VAE example at 60 s: augment 14.2 +- 2.7, collate 0.4 +- 0.5 ms per batch, and
    # the per-round estimate of their difference (it counts `augmented` twice) read +-6:
    # "tied" with a stage whose upper bound (1.9) is under augment's lower bound (6.1)
    wide = OneContrast(Contrast(0.0, 6.0e-3, 13, 14))
    own = {p: {p: 1.0} for p in ("full", "raw", "augmented", "device")}  # no point pooled with another

    top = StageCost("augment", "ok", upper="augmented", lower="raw", sec_per_batch=14.2e-3, sigma=2.7e-3)
    other = StageCost("collate", "ok", upper="device", lower="augmented", sec_per_batch=0.4e-3, sigma=0.5e-3)
    (lead,) = leads((top, other), own, wide, t_full=40e-3, noise_scale=1.0)
    assert lead.sigma == pytest.approx(3.2e-3) and lead.real
    near = StageCost("load", "ok", upper="raw", lower="full", sec_per_batch=10.0e-3, sigma=3.1e-3)
    (lead,) = leads((top, near), own, wide, t_full=40e-3, noise_scale=1.0)
    assert not lead.real  # 4.2 ms apart: within 2 x (2.7 + 3.1), Z_LEAD's bound of the two


def test_a_pooled_point_without_a_noise_estimate_leaves_the_drop_s_noise_unknown_not_undefined():
    # augmented pooled with device (weights 1:3); the pair full - augmented has no noise
    # estimate (one round, nothing pooled to lend it one): the fitted gap's noise is
    # unknown (infinite), never NaN, and its estimate is the fitted one
    class OneRound:
        def contrast(self, coef):
            if "augmented" in coef:
                return Contrast(0.0, math.inf, 0, 1)
            return Contrast(0.0, 1e-3, 9, 10)

        def time(self, point):
            return {"full": 0.110, "augmented": 0.090, "device": 0.100}[point]

    block = {"augmented": 0.25, "device": 0.75}
    c = drop(OneRound(), {"full": {"full": 1.0}, "augmented": block, "device": block}, "full", "device")
    assert c.estimate == pytest.approx(0.110 - 0.0975) and c.se == c.sigma == c.upper(2.0) == math.inf


def test_a_lead_pooled_over_few_rounds_is_asked_at_the_noise_rule_s_level():
    # the same lead and error: at 97.7% from FEW_ROUNDS rounds on, at 3 sigma below where
    # the error leans on the noise pooled over the points (which reads low on small
    # tables); a lead whose error is its own per-round values' is asked at 97.7% at any
    # number of rounds, Student's t at its degrees of freedom being the margin
    own = {p: {p: 1.0} for p in ("full", "raw", "augmented")}
    top = StageCost("augment", "ok", upper="augmented", lower="raw", sec_per_batch=30e-3, sigma=20e-3, df=8)
    other = StageCost("load", "ok", upper="raw", lower="full", sec_per_batch=14e-3, sigma=20e-3, df=8)

    def lead(rounds, pooled):
        (out,) = leads((top, other), own, OneContrast(Contrast(0.0, 5.0e-3, 8, rounds, pooled=pooled)),
                       t_full=100e-3, noise_scale=1.0)
        return out
    few, enough = lead(FEW_ROUNDS - 1, True), lead(FEW_ROUNDS, True)
    # 16 ms: over t(8) at 97.7% x 5 ms (11.8), under t(8) at 99.865% x 5 ms (21.4)
    assert enough.real and enough.threshold == pytest.approx(11.83e-3, rel=0.01)
    assert not few.real and few.threshold == pytest.approx(21.38e-3, rel=0.01)
    assert lead(FEW_ROUNDS - 1, False).threshold == pytest.approx(11.83e-3, rel=0.01)
