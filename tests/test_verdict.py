import pytest

from bisect_pipeline.stats import Throughput, Window
from bisect_pipeline.verdict import MIN_REL_DROP, decide

BS = 10


def tp(ms_per_batch: float, jitter: float = 0.0, n: int = 5) -> Throughput:
    """Windows of 10 steps at `ms_per_batch`, spread by +-jitter (relative)."""
    factors = [1 - jitter, 1 - jitter / 2, 1, 1 + jitter / 2, 1 + jitter][:n]
    return Throughput(tuple(Window(10, 10 * ms_per_batch / 1e3 * f) for f in factors), BS)


CPU = {"host": "no accelerator: host and device coincide"}


def costs(v):
    return {s.stage: s for s in v.stages}


def test_augment_bound_names_augment_with_exact_costs():
    m = {"device": tp(10), "collated": tp(11), "augmented": tp(12), "raw": tp(60), "full": tp(62)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "augment"
    c = costs(v)
    assert c["augment"].sec_per_batch == pytest.approx(0.048)
    assert c["augment"].share_of_gap == pytest.approx(48 / 52)
    # if augment were free: 62 - 48 = 14 ms per batch -> 10 / 0.014 samples/s
    assert c["augment"].samples_per_sec_if_free == pytest.approx(BS / 0.014)
    assert c["load"].sec_per_batch == pytest.approx(0.002) and not c["load"].significant
    assert c["transfer"].status == "skipped"
    assert c["handoff"].includes == ("handoff",)
    assert v.input_bound_fraction == pytest.approx(52 / 62)


def test_none_when_full_runs_at_ceiling():
    m = {"device": tp(40), "collated": tp(40.5), "augmented": tp(40.2), "raw": tp(40.8), "full": tp(41)}
    assert decide(m, BS, CPU).bottleneck == "none"


def test_small_drop_under_min_rel_drop_is_none_even_without_noise():
    below = 40 * (1 + MIN_REL_DROP * 0.8)
    m = {"device": tp(40), "full": tp(below)}
    assert decide(m, BS, CPU).bottleneck == "none"


def test_noise_makes_a_real_looking_drop_inconclusive():
    # full is 20% slower than the ceiling, but every point's windows spread +-60%
    m = {"device": tp(40, 0.6), "augmented": tp(44, 0.6), "raw": tp(46, 0.6), "full": tp(48, 0.6)}
    v = decide(m, BS, CPU)
    assert v.bottleneck in ("none", "inconclusive")


def test_two_equal_stages_are_inconclusive():
    m = {"device": tp(10), "collated": tp(10), "augmented": tp(10), "raw": tp(40), "full": tp(70)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "inconclusive"
    assert "load" in v.reason and "augment" in v.reason


def test_gap_with_no_significant_stage_is_inconclusive():
    # 4 stages each add 3% of full: the sum is a real gap, no stage stands out
    m = {"device": tp(100), "collated": tp(103), "augmented": tp(106), "raw": tp(109), "full": tp(112)}
    assert decide(m, BS, CPU).bottleneck == "inconclusive"


def test_missing_raw_merges_load_and_augment_into_load():
    m = {"device": tp(10), "collated": tp(11), "augmented": tp(12), "full": tp(60)}
    v = decide(m, BS, CPU)
    c = costs(v)
    assert v.bottleneck == "load"
    assert c["load"].includes == ("load", "augment")
    assert c["augment"].status == "merged"


def test_transfer_measured_with_an_accelerator():
    m = {"device": tp(10), "host": tp(30), "collated": tp(31), "augmented": tp(31), "raw": tp(32), "full": tp(32)}
    v = decide(m, BS, {})
    assert v.bottleneck == "transfer"
    assert costs(v)["transfer"].sec_per_batch == pytest.approx(0.020)


def test_no_verdict_without_full_or_without_a_second_point():
    assert decide({"device": tp(10)}, BS, CPU).bottleneck is None
    assert decide({"full": tp(10)}, BS, CPU).bottleneck is None
