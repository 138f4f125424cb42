"""The public-pipelines benchmark's reference (scripts/bench_public_pipelines.reference):
what the hand expects from its paired timings, and what its own noise cannot rule out.
A grade is only as good as its reference, so the rules are checked on planted timings."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

from bench_public_pipelines import reference  # noqa: E402


def rounds(load, augment, rest, alone=100.0):
    """Per-round timings of the four variants from per-round stage costs."""
    n = len(load)
    step = [alone] * n
    no_augment = [s + r for s, r in zip(step, rest)]
    no_load = [a + g for a, g in zip(no_augment, augment)]
    full = [b + l for b, l in zip(no_load, load)]
    return {"full": full, "no load": no_load, "no augment": no_augment, "step alone": step}


def test_a_steady_lead_is_expected_alone_and_rules_the_others_out():
    r = reference(rounds(load=[10, 11, 9, 10, 10, 11], augment=[40, 42, 39, 41, 40, 38], rest=[1, 0, 2, 1, 1, 0]))
    assert r["expected"] == ["augment"]
    assert r["not_ruled_out"] == ["augment"]
    assert abs(r["lead_ms"] - 29.83) < 0.01
    assert r["pairs_to_tell"] == 1


def test_a_lead_inside_the_hand_s_own_noise_is_not_ruled_out():
    # augment leads load by 10 ms on the median, but the rounds swing by 40 ms
    load = [30, 60, 10, 50, 20, 40]
    augment = [70, 20, 80, 30, 75, 35]
    r = reference(rounds(load=load, augment=augment, rest=[1] * 6))
    assert r["expected"] == ["augment"]  # the 25% rule: load (35) is under 0.75 x augment (52.5)
    assert r["not_ruled_out"] == ["augment", "load"]
    assert r["pairs_to_tell"] > 6
    assert r["load_sd_ms"] > 15 and r["rest_sd_ms"] == 0


def test_a_runner_up_within_a_quarter_is_expected_with_the_top():
    r = reference(rounds(load=[36, 37, 35, 36], augment=[40, 41, 40, 39], rest=[0, 1, 0, 1]))
    assert r["expected"] == ["augment", "load"]


def test_a_gap_under_a_tenth_of_full_expects_none():
    r = reference(rounds(load=[2, 3, 2, 3], augment=[4, 3, 4, 3], rest=[1, 1, 1, 1], alone=100.0))
    assert r["expected"] == ["none"]
