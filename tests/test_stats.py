import math

import pytest

from bisect_pipeline.stats import Throughput, Window, iqr, median, quantile


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
    assert many.rel_se == pytest.approx(few.rel_se / 2)
    expected = 1.2533 * (few.rel_iqr / 1.349) / math.sqrt(5)
    assert few.rel_se == pytest.approx(expected)
    # sec_per_batch and samples/s share the same relative error
    assert few.sec_per_batch_sigma == pytest.approx(few.sec_per_batch * few.rel_se)


def test_identical_windows_have_no_spread():
    tp = Throughput((Window(5, 0.5),) * 4, batch_size=2)
    assert tp.iqr == 0 and tp.rel_se == 0 and not tp.noisy
