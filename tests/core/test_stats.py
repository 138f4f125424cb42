import math
import random

import pytest

from bisect_pipeline.core import noise, stats
from bisect_pipeline.core.stats import (MIN_REL_DROP, Z_NOISE, Throughput, Window, decreasing_blocks, iqr, is_real,
                                        median, median_se, noise_threshold, order_se, point_sigmas, quantile,
                                        small_sample_factor, t_factor)


def test_median_odd_even():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5


def test_quantile_matches_numpy_linear_method():
    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    assert quantile(values, 0.25) == 2.0
    assert quantile(values, 0.75) == 8.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert iqr(values) == 6.0


def test_quantile_rejects_bad_input():
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


def test_throughput_is_steps_over_time_per_window():
    # Three windows of 10 steps of batch 4: 10/0.5, 10/0.4, 10/0.25 batches/s.
    tp = Throughput((Window(10, 0.5), Window(10, 0.4), Window(10, 0.25)), batch_size=4)
    assert tp.samples_per_sec == pytest.approx(100.0)  # median of 80, 100, 160
    assert tp.sec_per_batch == pytest.approx(0.04)
    assert tp.iqr == pytest.approx(130.0 - 90.0)
    assert tp.rel_iqr == pytest.approx(0.4)
    assert tp.noisy
    assert tp.steps == 30 and tp.seconds == pytest.approx(1.15)


def test_standard_error_shrinks_with_windows():
    secs = (0.9, 0.95, 1.0, 1.05, 1.1)
    few = Throughput(tuple(Window(10, s) for s in secs), 1)
    many = Throughput(tuple(Window(10, s) for s in secs * 4), 1)  # same IQR, 4x the windows
    assert many.iqr == pytest.approx(few.iqr)
    # sqrt(4) fewer for the windows, and a smaller small-sample correction (t(19) vs t(4))
    assert many.rel_se == pytest.approx(few.rel_se / 2 * small_sample_factor(20) / small_sample_factor(5))
    assert many.rel_se < few.rel_se / 2
    expected = 1.2533 * (few.rel_iqr / 1.349) / math.sqrt(5) * small_sample_factor(5)
    assert few.rel_se == pytest.approx(expected)
    # sec_per_batch and samples/s share the same relative error
    assert few.sec_per_batch_sigma == pytest.approx(few.sec_per_batch * few.rel_se)


def test_identical_windows_have_no_spread():
    tp = Throughput((Window(5, 0.5),) * 4, batch_size=2)
    assert tp.iqr == 0 and tp.rel_se == 0 and not tp.noisy


def test_is_real_needs_both_the_noise_and_the_floor():
    # 3 sigma = 3 ms, 5% of 100 ms = 5 ms: the threshold is the larger
    assert noise_threshold(0.001, 0.100) == pytest.approx(MIN_REL_DROP * 0.100)
    assert not is_real(0.0049, 0.001, 0.100) and is_real(0.0051, 0.001, 0.100)
    # a noisy pair: 3 sigma = 9 ms beats the floor
    assert noise_threshold(0.003, 0.100) == pytest.approx(Z_NOISE * 0.003)
    assert not is_real(0.0089, 0.003, 0.100) and is_real(0.0091, 0.003, 0.100)
    # scale asks for a margin
    assert not is_real(0.0091, 0.003, 0.100, scale=1.5)


def _fitted(values, weights):
    """The fitted values: each block's weighted mean, as drops.fit takes them."""
    out = []
    for block in decreasing_blocks(values, weights):
        out += [sum(values[i] * weights[i] for i in block) / sum(weights[i] for i in block)] * len(block)
    return out


def test_decreasing_blocks_pool_violators_to_their_weighted_mean():
    assert decreasing_blocks([5.0, 4.0, 3.0], [1, 1, 1]) == [[0], [1], [2]]  # already ordered: untouched
    assert decreasing_blocks([4.0, 5.0, 1.0], [1, 1, 1]) == [[0, 1], [2]]
    assert _fitted([4.0, 5.0, 1.0], [1, 1, 1]) == [4.5, 4.5, 1.0]
    assert _fitted([4.0, 5.0, 1.0], [3, 1, 1]) == [4.25, 4.25, 1.0]  # the precise one weighs more
    # a violation further down pulls the pool along
    assert _fitted([2.0, 1.0, 3.0], [1, 1, 1]) == [2.0, 2.0, 2.0]
    fit = _fitted([9.0, 3.0, 4.0, 1.0, 2.0], [1, 2, 1, 1, 1])
    assert fit == sorted(fit, reverse=True) and fit[0] == 9.0


def test_small_sample_factor_is_students_t_over_z():
    assert small_sample_factor(1) == math.inf  # one window: no estimate of the noise
    assert small_sample_factor(6) == pytest.approx(5.507 / Z_NOISE)  # t(5) at 99.865%
    assert small_sample_factor(31) == pytest.approx(3.27 / Z_NOISE, rel=1e-3)
    assert small_sample_factor(1000) == pytest.approx(1.0, rel=0.01)
    factors = [small_sample_factor(n) for n in range(2, 60)]
    assert factors == sorted(factors, reverse=True)


def test_one_window_has_unknown_noise_and_decides_nothing():
    one = Throughput((Window(10, 1.0),), 1)
    assert one.rel_iqr == 0 and one.rel_se == math.inf
    assert not is_real(10.0, one.sec_per_batch_sigma, 1.0)


def two(ms: float, rel: float) -> Throughput:
    """Two one-step windows `rel` apart (a long step's visit)."""
    return Throughput((Window(1, ms / 1e3), Window(1, ms / 1e3 * (1 + rel))), 1)


def test_few_tight_windows_get_the_noise_pooled_over_the_points_not_an_unbounded_error():
    # a long step: two windows per point, agreeing within 2-4%; alone each point's error
    # is t at one degree of freedom (78 z) times its spread
    m = {"device": two(800, 0.02), "augmented": two(810, 0.03), "raw": two(820, 0.04), "full": two(1000, 0.02)}
    alone = m["full"].sec_per_batch_sigma
    pooled = point_sigmas(m)
    assert alone > 0.5  # over half a second on a 1 s batch: the "+162 ms, error +-3,863 ms"
    ss = sum((math.log(1 + r) / math.sqrt(2)) ** 2 for r in (0.02, 0.03, 0.04, 0.02))  # 4 points, one df each
    expect = 1.0 * math.sqrt(ss / 4) * 1.2533 / math.sqrt(2) * t_factor(4)
    assert pooled["full"] == pytest.approx(expect, rel=0.02) and pooled["full"] < 0.1 * alone
    assert pooled["full"] * 3 < 0.18  # the 180 ms gap is now beyond the noise


def test_a_point_noisier_than_the_rest_keeps_its_own_spread():
    m = {"device": two(800, 0.01), "augmented": two(800, 0.01), "raw": two(800, 0.01), "full": two(1000, 0.3)}
    pooled = point_sigmas(m)
    own_sd = math.log(1.3) / math.sqrt(2)
    assert pooled["full"] == pytest.approx(m["full"].sec_per_batch * own_sd * 1.2533 / math.sqrt(2) * t_factor(4))
    assert pooled["device"] < pooled["full"] / 2  # the quiet points: the pooled spread (which the noisy one raises)


def test_a_single_window_everywhere_has_no_noise_to_pool():
    one = Throughput((Window(10, 1.0),), 10)
    assert point_sigmas({"full": one})["full"] == math.inf  # nothing to pool: no noise known


def test_order_se_agrees_with_the_iqr_rule_on_one_cluster_and_spans_two():
    # one cluster (Gaussian quantiles): about median_se's figure without its small-sample
    # widening; two clusters 20 apart: half the distance between them, where the IQR
    # rule says the median is known to a fraction of that
    n = 61
    gauss = [math.sqrt(2) * _erfinv(2 * (i + 0.5) / n - 1) for i in range(n)]
    assert order_se(gauss) == pytest.approx(median_se(gauss) / small_sample_factor(n), rel=0.25)
    two = [-10.0 + 0.1 * (i % 5) if i % 2 else 10.0 - 0.1 * (i % 5) for i in range(n)]
    assert order_se(two) > 9.0 and median_se(two) < 4.0
    assert order_se(two[:7]) == 0.0  # below ORDER_SE_MIN_N: a range, not an error


def _erfinv(y: float) -> float:
    lo, hi = -6.0, 6.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return (lo + hi) / 2


def _polished_noise(points: int, rounds: int, missing: set, sigma: float, rng) -> float:
    cells = {f"p{i}": {r: math.log(100.0 + 10 * i) + 0.1 * r + rng.gauss(0.0, sigma)
                       for r in range(rounds) if (i, r) not in missing} for i in range(points)}
    mu, drift = noise.median_polish(cells)
    residuals = [x - mu[p] - drift[r] for p, c in cells.items() for r, x in c.items()]
    return noise.residual_noise(residuals, len(residuals) - len(mu) - len(drift) + 1)


@pytest.mark.parametrize("points,rounds,missing", [
    (5, 3, {(1, 0), (0, 2), (1, 2), (2, 2)}),  # the ImageNet example's table at 2-3 rounds
    (5, 2, set()), (3, 15, set()), (4, 8, set())])
def test_the_pooled_noise_of_the_rounds_is_calibrated_on_the_tables_they_make(points, rounds, missing):
    # Gaussian noise of known sigma on tables of the rounds' shapes: the pooled estimate's
    # median is at least 0.65 sigma, and a tenth of the tables at most read under 0.2
    # sigma. The IQR of all the residuals, used before, read a median of 0.42-0.70 and
    # under 0.2 sigma in a quarter of the sparse tables, where the polish fits half the
    # cells exactly (0 there: every cost real).
    rng = random.Random(0)
    sigma = 0.05
    ratios = sorted(_polished_noise(points, rounds, missing, sigma, rng) / sigma for _ in range(400))
    assert 0.65 <= ratios[len(ratios) // 2] <= 1.25
    assert ratios[len(ratios) // 10] > 0.2


def test_a_table_the_polish_fits_exactly_in_half_its_cells_still_has_noise():
    residuals = [0.0, 0.0, 0.0, 0.0, 0.03, -0.03, 0.02, -0.02, 0.0]
    free = [0.03, -0.03, 0.02, -0.02]
    assert stats.iqr(residuals) == 0.0  # the spread of them all says no noise at all
    assert noise.residual_noise(residuals, 4) == pytest.approx(stats.iqr(free) / stats.IQR_PER_SIGMA)
    assert noise.residual_noise(residuals, 0) == math.inf


def test_a_contrast_widened_at_a_level_gives_student_s_bound_there():
    # sigma is the error widened at Z_NOISE's level; at 97.7% (z = 2) and 4 rounds
    # (3 degrees of freedom) z of it is t = 3.31 standard errors, and with no spread
    # estimated (df 0) there is no bound
    c = stats.Contrast(10.0, 1.5, 3, 4)
    assert c.widened(Z_NOISE) == pytest.approx(c.sigma, rel=1e-3)
    assert 2.0 * c.widened(2.0) == pytest.approx(3.3068 * 1.5, rel=1e-3)
    assert 2.0 * c.widened(2.0) + c.estimate == pytest.approx(c.upper(2.0))
    assert stats.Contrast(10.0, 1.5, math.inf).widened(2.0) == pytest.approx(1.5)
    assert stats.Contrast(10.0, 1.5, 0).widened(2.0) == math.inf


def test_one_comparison_asks_at_97_7_percent_and_the_noise_rule_where_pooled_over_few_rounds():
    from bisect_pipeline.core.stats import FEW_ROUNDS, Z_LEAD, Z_NOISE, Contrast, compare, level, paired, unpaired

    own = Contrast(0.1, 0.02, 3, 4)
    assert level(own) == Z_LEAD and level(Contrast(0.1, 0.02, 8, FEW_ROUNDS - 1, pooled=True)) == Z_NOISE
    assert level(Contrast(0.1, 0.02, 3, None)) == Z_NOISE  # from windows: a document of schema 1
    c = compare(own, 1.0)  # t(3) at 97.7% is 3.31: 0.1 > 3.31 x 0.02
    assert c.real and c.threshold == pytest.approx(0.02 * 3.31, rel=0.01) and c.low < 0.1 < c.high
    assert not compare(Contrast(0.04, 0.001, 30, 31), 1.0).real  # under the 5% floor
    # paired: the pairs' log ratios, Student's paired t
    p = paired([2.0, 4.0], [1.0, 2.1])
    assert p.rounds == 2 and p.df == 1 and p.estimate == pytest.approx(-0.6689, abs=1e-3)
    # unpaired: each side's own spread, at Welch's degrees of freedom
    u = unpaired([1.0, 1.1, 0.9], [2.0, 2.2, 1.8])
    assert u.estimate == pytest.approx(-0.6931, abs=1e-3) and 3.9 < u.df <= 4.0
