"""verdict.decide on planted numbers: every rule of the verdict, exact values."""

import pytest

from bisect_pipeline.stats import MIN_REL_DROP, Throughput, Window
from bisect_pipeline.verdict import (NONE_MAX_LOSS, SETTLE_NOISE_SCALE, Verdict, decide, deciding_points,
                                     in_question, self_check, settled)

BS = 10


def tp(ms_per_batch: float, jitter: float = 0.0, n: int = 5) -> Throughput:
    """Windows of 10 steps at `ms_per_batch`, spread by +-jitter (relative)."""
    factors = [1 - jitter, 1 - jitter / 2, 1, 1 + jitter / 2, 1 + jitter][:n]
    return Throughput(tuple(Window(10, 10 * ms_per_batch / 1e3 * f) for f in factors), BS)


CPU = {"host": "no accelerator: host and device coincide"}


def costs(v):
    return {s.stage: s for s in v.stages}


def shares_add_up(v):
    total = sum(s.share_of_gap or 0 for s in v.stages if s.status == "ok")
    return total == pytest.approx(1.0) if v.gap_sec_per_batch else total == 0


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
    assert v.ceiling == "device" and not v.inconsistent and shares_add_up(v)


def test_none_when_full_runs_at_the_ceiling_and_the_bound_is_tight():
    m = {"device": tp(40), "collated": tp(40.5), "augmented": tp(40.2), "raw": tp(40.8), "full": tp(41)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "none"
    assert shares_add_up(v)


def test_small_drop_under_min_rel_drop_is_none_without_noise():
    below = 40 * (1 + MIN_REL_DROP * 0.8)
    assert decide({"device": tp(40), "full": tp(below)}, BS, CPU).bottleneck == "none"


def test_a_noisy_run_is_inconclusive_never_none_and_says_where_the_noise_is():
    # full is 20% slower than the ceiling, but every point's windows spread +-60%
    m = {"device": tp(40, 0.6), "augmented": tp(44, 0.6), "raw": tp(46, 0.6), "full": tp(48, 0.6)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "inconclusive"
    assert "too noisy" in v.reason and "device ±" in v.reason and "--max-seconds" in v.reason


def test_a_small_gap_with_a_loose_upper_bound_is_not_none():
    # no drop is real and the gap estimate is 0, but the ceiling's spread leaves room
    # for a loss above NONE_MAX_LOSS: the run has not shown that the pipeline keeps up.
    m = {"device": tp(40, 0.45), "full": tp(40)}
    v = decide(m, BS, CPU)
    assert v.gap_sec_per_batch + 2 * v.gap_sigma > NONE_MAX_LOSS * 0.040
    assert v.bottleneck == "inconclusive"


def test_never_none_beside_a_real_stage_even_when_the_ceiling_is_noisy():
    # The case: device's windows spread +-100%, so full -> device looks like
    # noise, but raw -> augmented (tight points) is a real 48 ms drop.
    m = {"device": tp(12, 1.0), "collated": tp(12), "augmented": tp(12.5), "raw": tp(60), "full": tp(61)}
    v = decide(m, BS, CPU)
    assert costs(v)["augment"].significant
    assert v.bottleneck == "augment"


def test_two_equal_stages_are_inconclusive():
    m = {"device": tp(10), "collated": tp(10), "augmented": tp(10), "raw": tp(40), "full": tp(70)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "inconclusive"
    assert "load" in v.reason and "augment" in v.reason


def test_gap_with_no_significant_stage_is_inconclusive():
    # 4 stages each add 3% of full: the sum is a real gap, no stage stands out
    m = {"device": tp(100), "collated": tp(103), "augmented": tp(106), "raw": tp(109), "full": tp(112)}
    v = decide(m, BS, CPU)
    assert v.bottleneck == "inconclusive" and "no single stage" in v.reason


def test_points_out_of_order_within_noise_are_pooled_never_over_100_percent():
    # raw measured slower than full (within its noise), device slower than collated:
    # the fitted times keep the order, load and handoff cost 0, augment is 100% of the gap.
    m = {"device": tp(36, 0.1), "collated": tp(35, 0.1), "augmented": tp(36), "raw": tp(106, 0.2),
         "full": tp(98, 0.3)}
    v = decide(m, BS, CPU)
    c = costs(v)
    assert v.bottleneck == "augment"
    assert c["load"].sec_per_batch == 0 and c["handoff"].sec_per_batch == 0
    assert all((s.share_of_gap or 0) <= 1.0 for s in v.stages)
    assert shares_add_up(v)
    fitted = [v.fitted[p] for p in ("full", "raw", "augmented", "collated", "device")]
    assert fitted == sorted(fitted, reverse=True)
    assert v.fitted["raw"] == v.fitted["full"]


def test_a_ceiling_below_a_point_beyond_noise_is_left_out_and_named():
    # The measurement: device 1,389/s below collated 1,960/s with tight windows.
    m = {"device": tp(23.0), "collated": tp(16.3), "augmented": tp(16.5), "raw": tp(50), "full": tp(51)}
    v = decide(m, BS, CPU)
    assert [(i.slower, i.faster) for i in v.inconsistent] == [("device", "collated")]
    assert v.ceiling == "collated" and "device" not in v.fitted
    assert "device" in v.inconsistent[0].describe() and "collated" in v.inconsistent[0].describe()
    assert v.bottleneck == "augment" and shares_add_up(v)
    assert costs(v)["handoff"].status == "unavailable"


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


def decisions(m):
    return (decide(m, BS, CPU), decide(m, BS, CPU, noise_scale=SETTLE_NOISE_SCALE),
            decide(m, BS, CPU, noise_scale=1 / SETTLE_NOISE_SCALE))


def test_settled_asks_for_a_margin():
    clear = {"device": tp(10, 0.02), "collated": tp(10, 0.02), "augmented": tp(11, 0.02), "raw": tp(60, 0.02),
             "full": tp(61, 0.02)}
    assert settled(*decisions(clear))
    # augment is real at the measured noise, but not with 1.5x as much: measure more.
    close = {"device": tp(40, 0.08), "augmented": tp(40, 0.08), "raw": tp(60, 0.08), "full": tp(60, 0.08)}
    v, more, less = decisions(close)
    assert v.bottleneck == "augment" and more.bottleneck != "augment"
    assert not settled(v, more, less)
    noisy = {"device": tp(40, 0.6), "full": tp(48, 0.6)}
    assert not settled(*decisions(noisy))


def test_none_settles_when_less_noise_would_not_reveal_a_stage():
    flat = {"device": tp(40, 0.02), "augmented": tp(40.2, 0.02), "raw": tp(40.4, 0.02), "full": tp(40.6, 0.02)}
    v, more, less = decisions(flat)
    assert v.bottleneck == "none" and settled(v, more, less)
    # the rule itself: a none that less noise would turn into a stage is not settled
    none, stage = Verdict("none", ()), Verdict("augment", ())
    assert settled(none, Verdict("inconclusive", ()), none)
    assert not settled(none, none, stage)
    assert not settled(stage, Verdict("inconclusive", ()), stage) and settled(stage, stage, none)
    assert not settled(Verdict("inconclusive", ()), stage, stage)


def test_deciding_points_follow_the_question():
    named = decide({"device": tp(10), "collated": tp(11), "augmented": tp(12), "raw": tp(60), "full": tp(62)}, BS, CPU)
    assert deciding_points(named) == {"full", "raw", "augmented"}  # augment, and load the runner-up
    flat = decide({"device": tp(40), "augmented": tp(40.2), "raw": tp(40.4), "full": tp(40.6)}, BS, CPU)
    assert deciding_points(flat) == {"full", "device"}  # none: only the gap matters
    spread = decide({"device": tp(100), "collated": tp(103), "augmented": tp(106), "raw": tp(109), "full": tp(112)},
                    BS, CPU)
    assert deciding_points(spread) == {"full", "raw", "augmented", "collated", "device"}


def test_self_check_passes_a_consistent_report_and_names_each_broken_rule():
    m = {"device": tp(10), "collated": tp(11), "augmented": tp(12), "raw": tp(60), "full": tp(62)}
    v = decide(m, BS, CPU)
    shown = {p: BS / t for p, t in v.fitted.items()}
    assert self_check(shown, v, num_workers=0, pinned_transfer=False) == []
    bad = dict(shown, collated=shown["device"] * 1.2)
    assert any("collated slower than" not in p and "device slower than collated" in p
               for p in self_check(bad, v, 0, False))
    handoff = {"device": tp(10), "collated": tp(30), "augmented": tp(30), "full": tp(31)}
    vh = decide(handoff, BS, CPU)
    found = self_check({p: BS / t for p, t in vh.fitted.items()}, vh, num_workers=0, pinned_transfer=False)
    assert any("num_workers=0" in p for p in found)
    assert self_check({p: BS / t for p, t in vh.fitted.items()}, vh, num_workers=2, pinned_transfer=False) == []


def test_a_real_small_stage_is_not_named_beside_a_larger_drop_that_is_not_pinned_down():
    # bench_under_load, planted load at num_workers=2: the worker points are so noisy that
    # the 21 ms drop into collated is not real, while the handoff (5.7 ms, tight) is.
    m = {"device": tp(7.8, 0.1), "collated": tp(13.5, 0.1), "augmented": tp(34.5, 0.9), "raw": tp(34.5, 0.9),
         "full": tp(39.3, 0.3)}
    v = decide(m, BS, CPU)
    c = costs(v)
    assert c["handoff"].significant and not c["collate"].significant
    assert v.bottleneck == "inconclusive"
    assert "handoff adds a real" in v.reason and "collate may cost more" in v.reason


def test_a_real_top_stage_is_named_only_when_it_beats_the_runner_up():
    # augment is real (48 ms); load's estimate (40 ms) is noisy but could be as large
    m = {"device": tp(10), "collated": tp(10), "augmented": tp(10), "raw": tp(58), "full": tp(98, 0.5)}
    v = decide(m, BS, CPU)
    assert costs(v)["augment"].significant and not costs(v)["load"].significant
    assert v.bottleneck == "inconclusive" and "load may cost as much" in v.reason


def test_handoff_does_not_apply_where_collated_coincides_with_device_but_merges_where_it_is_not_selected():
    m = {"device": tp(10), "augmented": tp(11), "raw": tp(60), "full": tp(62)}
    na = decide(m, BS, dict(CPU, collated="num_workers=0: collated and device coincide"))
    assert costs(na)["handoff"].status == "skipped" and "num_workers=0" in costs(na)["handoff"].reason
    assert costs(na)["collate"].includes == ("collate",)
    merged = decide(m, BS, CPU)  # collated left out by the points option: not in `skipped`
    assert costs(merged)["handoff"].status == "merged" and costs(merged)["collate"].includes == ("collate", "handoff")


def test_the_suites_verdict_check_takes_only_the_planted_stage_or_an_unsettled_inconclusive_led_by_it():
    from conftest import assert_names

    def doc(bottleneck, settled, real):
        return {"bottleneck": bottleneck, "run": {"settled": settled}, "verdict": {},
                "stages": [{"stage": s, "status": "ok", "significant": s in real} for s in ("load", "augment", "collate")]}

    assert_names(doc("augment", True, ["augment"]), "augment")
    assert_names(doc("inconclusive", False, ["augment"]), "augment")  # time ran out, augment the only real cost
    for wrong in (doc("load", True, ["load"]), doc("none", False, []), doc(None, False, []),
                  doc("inconclusive", True, ["augment"]), doc("inconclusive", False, ["augment", "load"]),
                  doc("inconclusive", False, ["load"])):
        with pytest.raises(AssertionError):
            assert_names(wrong, "augment")
    # none: or an unsettled inconclusive with no stage real (the gap too noisy to rule out)
    assert_names(doc("none", True, []), "none")
    assert_names(doc("inconclusive", False, []), "none")
    for wrong in (doc("inconclusive", False, ["load"]), doc("inconclusive", True, []), doc("augment", True, ["augment"])):
        with pytest.raises(AssertionError):
            assert_names(wrong, "none")


def test_the_stages_in_question_are_the_named_one_or_the_two_tied_for_the_lead():
    named = decide({"device": tp(10), "collated": tp(11), "augmented": tp(12), "raw": tp(60), "full": tp(62)}, BS, CPU)
    assert in_question(named) == ("augment",)
    tied = decide({"device": tp(10), "collated": tp(10), "augmented": tp(10), "raw": tp(40), "full": tp(70)}, BS, CPU)
    assert tied.bottleneck == "inconclusive" and set(in_question(tied)) == {"load", "augment"}
    led = decide({"device": tp(10), "collated": tp(10), "augmented": tp(10), "raw": tp(58), "full": tp(98, 0.5)}, BS, CPU)
    assert led.bottleneck == "inconclusive" and set(in_question(led)) == {"load", "augment"}  # load may cost as much
    spread = decide({"device": tp(100), "collated": tp(103), "augmented": tp(106), "raw": tp(109), "full": tp(112)},
                    BS, CPU)
    assert spread.bottleneck == "inconclusive" and in_question(spread) == ()  # no stage real: nothing to look inside
    flat = decide({"device": tp(40), "augmented": tp(40.2), "raw": tp(40.4), "full": tp(40.6)}, BS, CPU)
    assert flat.bottleneck == "none" and in_question(flat) == ()
    assert in_question(decide({"full": tp(10)}, BS, CPU)) == ()  # no verdict
