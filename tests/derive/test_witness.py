"""The second witness (witness.py, verdict._witnessed) on planted numbers: the rounds'
drops held against each worker stage's cost alone, exact values on a fake table."""

import pytest

from bisect_pipeline.derive import witness
from bisect_pipeline.core.results import Collate, InLoop, Isolated, PerSample, StepTime, Workers
from bisect_pipeline.derive.self_check import self_check
from bisect_pipeline.derive.verdict import SETTLE_NOISE_SCALE, decide, deciding_points, named_cost, row_of, settled
from test_verdict import BS, NO_HANDOFF, by_round

CPU = {"host": "no accelerator: host and device coincide"}
# a round's wobble, alike at every point it touches: the lead of two stages moves by it
WOBBLE = [9.0, -8.0, 7.0, -9.0, 8.0, -7.0]


def alone(mode="serial", workers=0, cores=2, **ms) -> witness.Alone:
    """Each stage's work per batch alone (ms) with a standard error of 1% of it."""
    return witness.Alone({k: v / 1e3 for k, v in ms.items()}, {k: v / 1e5 for k, v in ms.items()}, mode, workers,
                         cores, samples=200)


def three(ms: dict, a=None, skipped=NO_HANDOFF):
    """The verdict at the noise measured, with more (settled's margin) and with less."""
    return tuple(decide(by_round(ms), BS, skipped, noise_scale=k, alone=a)
                 for k in (1, SETTLE_NOISE_SCALE, 1 / SETTLE_NOISE_SCALE))


def tied_rounds(load: float, augment: float) -> dict:
    """load and augment whose readings the rounds cannot order: `raw` wobbles round by
    round, so the lead of one over the other swings by +-9 ms."""
    return {"device": [30] * 6, "augmented": [30.5] * 6, "raw": [30.5 + augment + w for w in WOBBLE],
            "full": [30.5 + augment + load] * 6}


def test_a_lead_the_rounds_cannot_tell_but_the_costs_alone_show_twice_is_named_with_its_reason():
    ms = tied_rounds(load=30.0, augment=36.0)
    plain = decide(by_round(ms), BS, NO_HANDOFF)
    assert plain.bottleneck == "tie" and set(plain.tied) == {"augment", "load"}  # the rounds alone
    v, more, less = three(ms, alone(load=20.0, augment=40.0, collate=0.5))
    assert v.bottleneck == "augment" and v.witness == "isolated costs" and not v.disagree
    assert v.reason == ("augment leads: the rounds cannot separate it from load yet (augment 35.6, load 30.4 ms per "
                        "batch); alone it costs 2.0\u00d7 what load does (40.0 against 20.0 ms per batch)")
    assert v.predicted["augment"] == pytest.approx((0.040, 0.0004, 0.0004), rel=1e-6)
    assert self_check({p: BS / t for p, t in v.fitted.items()}, v, 0, False) == []
    assert settled(v, more, less)  # it stands with the margin: named sooner


def test_a_true_tie_stays_a_tie_when_the_costs_alone_are_equal_too():
    v, _, _ = three(tied_rounds(load=33.0, augment=33.0), alone(load=33.0, augment=33.0, collate=0.5))
    assert v.bottleneck == "tie" and set(v.tied) == {"augment", "load"} and v.witness == "rounds"


def test_witnesses_that_disagree_name_no_stage_and_do_not_settle():
    # the rounds read load 50 ms beyond their noise; alone load costs 5 and augment 40
    ms = {"device": [30] * 6, "augmented": [30.5] * 6, "raw": [35.5, 35.4, 35.6, 35.5, 35.4, 35.6],
          "full": [85.5, 85.6, 85.4, 85.5, 85.6, 85.4]}
    assert decide(by_round(ms), BS, NO_HANDOFF).bottleneck == "load"  # the rounds alone
    v, more, less = three(ms, alone(load=5.0, augment=40.0, collate=0.5))
    assert v.bottleneck == "tie" and v.tied == ("load", "augment") and v.witness == "disagree"
    assert "load" in v.disagree and "augment" in v.disagree
    assert "load reads 50.0 ms per batch in the loop where alone it costs 5.0" in v.reason
    assert "neither names a stage alone" in v.reason
    assert not settled(v, more, less)
    assert self_check({p: BS / t for p, t in v.fitted.items()}, v, 0, False) == []


def test_a_reading_many_times_its_cost_alone_keeps_the_run_from_settling():
    # issue 43's MNIST example, settled after 4 rounds as a tie of load and collate (5.4
    # and 3.1 ms per batch, augment 1.2); alone load costs 1.8, augment 4.0, collate 0.08
    ms = {"device": [50.0] * 4, "augmented": [53.1, 53.2, 53.0, 53.1], "raw": [54.3] * 4,
          "full": [59.7, 59.6, 59.8, 59.7]}
    assert settled(*three(ms))  # the rounds alone
    v, more, less = three(ms, alone(load=1.8, augment=4.0, collate=0.08))
    assert v.disagree == ("load", "collate") and not settled(v, more, less)
    assert "collate reads 3.1 ms per batch in the loop where alone it costs 0.1" in v.reason


def test_a_heavy_step_the_rounds_cannot_bound_is_none_by_its_costs_alone():
    # 1.7-s steps, three rounds that wobble by 10%: the rounds cannot bound the loss under
    # 10%; alone, load + augment + collate add 14 ms a batch (0.8%)
    ms = {"device": [1700, 1870, 1600], "full": [1720, 1650, 1890]}
    plain = decide(by_round(ms), BS, CPU)
    assert plain.bottleneck == "inconclusive"
    v = decide(by_round(ms), BS, CPU, alone=alone(load=10.0, augment=3.9, collate=0.1))
    assert v.bottleneck == "none" and v.witness == "isolated costs"
    assert v.reason == ("the full pipeline keeps up by its costs alone: its worker stages add at most 14.2 ms to a "
                        "batch of at least 880.1 ms (1.6% with nothing else between); the rounds, which cannot bound "
                        "the loss yet, read 20.3 ms and agree")
    # with workers on cores of their own: 410 ms of work a batch over 2 workers under a 1.7-s step
    on_gpu = {"host": [1700, 1870, 1600], "device": [1700, 1870, 1600], "full": [1720, 1650, 1890]}
    v = decide(by_round(on_gpu), BS, {}, alone=alone("parallel", 2, 16, load=300.0, augment=100.0, collate=10.0))
    assert v.bottleneck == "none" and v.witness == "isolated costs"
    # a busy machine that slowed every point (the MNIST example read 127 ms a batch where it
    # runs at 60): 8 ms of input is no longer under 10% of the step at its lower bound
    busy = {"device": [126, 90, 160], "augmented": [150, 126, 100], "raw": [100, 160, 126], "full": [170, 100, 126]}
    assert decide(by_round(busy), BS, NO_HANDOFF).bottleneck == "inconclusive"  # the rounds alone
    v = decide(by_round(busy), BS, NO_HANDOFF, alone=alone(load=1.7, augment=4.9, collate=0.1))
    # not none; and at num_workers=0 those 6.7 ms are a loss the loop pays for certain, over
    # 5% of its 130 ms: input-bound on the costs alone, augment first
    assert v.bottleneck == "augment" and v.witness == "isolated costs"
    assert v.reason == ("the pipeline loses at least 6.6 ms per batch to input by its worker stages' costs alone (5% "
                        "of 130.1 ms), and the rounds, which cannot tell yet, read 14.6 ms; by the costs alone augment "
                        "costs the loop 4.9 ms per batch against load's 1.7")
    # the same work on one worker, over the step: 576 ms a batch the worker cannot hide
    v = decide(by_round(on_gpu), BS, {}, alone=alone("parallel", 1, 16, load=1500.0, augment=800.0, collate=10.0))
    assert v.bottleneck == "load" and v.witness == "isolated costs"  # load, augment and collate merged: one stage


def test_a_stage_the_rounds_read_with_the_next_ones_is_named_where_the_costs_alone_split_them():
    # a 500-ms step behind 1 s of augment a batch at num_workers=0, only the ceiling and full
    # measured (the budget held no more): the rounds read load, augment and collate as one
    # row, 'load'; alone augment takes 80 ms of its 84.5, load 4 (issue 59: the planted
    # augment at --max-seconds 20 was named 'load (with augment, collate)')
    ms = {"device": [500.0], "full": [590.0]}
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=alone(load=4.0, augment=80.0, collate=0.5))
    assert v.bottleneck == "augment" and v.witness == "isolated costs" and v.tied == ()
    assert [round(v.within[n][0] * 1e3, 1) for n in ("load", "augment", "collate")] == [4.0, 80.0, 0.5]
    assert v.reason.endswith("; within load, augment and collate, which the rounds read together as load's row "
                             "(a point between them not measured), the costs alone give load 4.0, augment 80.0 and "
                             "collate 0.5 ms per batch: augment first")
    row = row_of(v, "augment")
    assert row.stage == "load" and row.lower == "full" and row.upper == "device"  # the row stays as the rounds read it
    assert named_cost(v, "augment") == pytest.approx(0.080) and named_cost(v, "load") == pytest.approx(0.004)
    # the next rounds measure the points around augment
    assert {"raw", "augmented"} <= deciding_points(v)
    # the rounds reading the row real (six rounds of 90 ms): still augment within it
    v = decide(by_round({"device": [500.0] * 6, "full": [590.0, 591.0, 589.0, 590.0, 592.0, 588.0]}), BS, NO_HANDOFF,
               alone=alone(load=4.0, augment=80.0, collate=0.5))
    assert row_of(v, "load").significant and v.bottleneck == "augment" and v.witness == "isolated costs"
    # settled where more noise names it or its row: more rounds leave the split as it is
    v, more, less = three(ms, alone(load=4.0, augment=80.0, collate=0.5))
    assert v.bottleneck == "augment" and settled(v, more, less)
    # load and augment alike alone: no more to say than the row, which stays named as the rounds read it
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=alone(load=42.0, augment=41.0, collate=0.5))
    assert v.bottleneck == "load" and not v.within
    # augment alike with collate, a row of its own (augmented measured): not ordered, the row stays
    v = decide(by_round({"device": [500.0], "augmented": [540.0], "full": [590.0]}), BS, NO_HANDOFF,
               alone=alone(load=2.0, augment=40.0, collate=39.0))
    assert not v.within and v.bottleneck != "augment"
    # 2 workers on cores of their own behind a 37-ms step, 112 ms of augment a batch: load's
    # drop, both points over the step, is its own work's noise over the workers, not the
    # noise of the two points' work, which share augment's (tests/test_run_scripts.py's
    # script at --points full,augmented,device)
    on_cores = witness.Alone({"load": 0.0005, "augment": 0.112, "collate": 0.0003},
                             {"load": 0.00005, "augment": 0.0112, "collate": 0.00003}, "parallel", 2, 2, samples=30)
    v = decide(by_round({"device": [36.8] * 4, "augmented": [36.8] * 4, "full": [59.5, 55.0, 62.0, 60.0]}), BS,
               NO_HANDOFF, alone=on_cores)
    assert v.bottleneck == "augment" and v.within["load"][1] == pytest.approx(0.000025)
    # augment not timed apart from load: the costs alone cannot split the row, which stays named
    merged = witness.Alone({"load": 0.084, "collate": 0.0005}, {"load": 0.00084, "collate": 0.000005}, "serial", 0, 2,
                           merged=True, samples=200)
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=merged)
    assert v.bottleneck == "load" and not v.within
    # all three measured: the rounds' own rows, nothing split
    full = {"device": [500.0] * 6, "augmented": [500.5] * 6, "raw": [580.0] * 6, "full": [584.0] * 6}
    v = decide(by_round(full), BS, NO_HANDOFF, alone=alone(load=4.0, augment=80.0, collate=0.5))
    assert v.bottleneck == "augment" and v.witness == "both" and not v.within


def test_two_items_whose_noise_is_the_slice_s_floor_order_as_the_floor_says():
    # the planted 1-s augment a batch at --max-seconds 20: two items of load and augment
    # timed, their own standard errors next to nothing; all the noise is the 10% floor
    # (witness.SLICE_NOISE), no estimate of 1 degree of freedom
    def record(se_load, se_augment):
        return Isolated(items_per_batch=8, load=PerSample(ms_per_sample=2.23, se_ms_per_sample=se_load,
                                                          includes=("load",), samples=2),
                        augment=PerSample(ms_per_sample=125.2, se_ms_per_sample=se_augment, samples=2),
                        collate=Collate(ms_per_batch=0.05, se_ms_per_batch=0.001, batches=66),
                        workers=Workers(cores=2, step_threads=2))
    ms = {"device": [2000.8], "full": [3019.2]}
    a = witness.alone(record(0.009, 0.006), {"num_workers": 0}, "cpu")
    assert a.samples == 2 and a.df > 1e6
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=a)
    assert v.bottleneck == "augment" and v.witness == "isolated costs"
    # the same two items spread by 20%: their own noise, at about 1.5 degrees of freedom,
    # cannot order them, and the row the rounds read stays named
    a = witness.alone(record(0.4, 25.0), {"num_workers": 0}, "cpu")
    assert 1 < a.df < 2
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=a)
    assert v.bottleneck == "load" and not v.within


def heavy(step_ms=2490.0, mode="serial", workers=0, **ms) -> witness.Alone:
    """The costs alone of a heavy step's run, its step timed alone at `step_ms`."""
    a = alone(mode, workers, **ms)
    return witness.Alone(a.work, a.se, a.mode, a.workers, a.cores, samples=a.samples, step=step_ms / 1e3)


def test_a_heavy_step_with_input_about_1pct_of_it_is_none_on_the_costs_alone_in_one_round():
    # the torchvision detection reference: a 2.5-s step, 10 batches in 30 s, one round of
    # the ceiling and full; alone load and augment take 25 ms a batch, 1% of the step
    ms = {"device": [2500.0], "full": [2560.0]}
    assert decide(by_round(ms), BS, CPU).bottleneck == "inconclusive"  # the rounds alone: no bound from 1 round
    v, more, less = three(ms, heavy(load=8.0, augment=16.5, collate=0.5))
    assert v.bottleneck == "none" and v.witness == "isolated costs" and not v.disagree
    assert v.reason == ("the full pipeline keeps up by its costs alone: its worker stages add at most 25.4 ms to a step "
                        "of 2490.0 ms, its faster reading (1.0% with nothing else between), under the 5% at which no stage's cost could "
                        "be real; the rounds, too few to bound the loss (1 round), agree: the step read 2500.0 ms in "
                        "the loop and 2490.0 alone, the full pipeline 2560.0 ms")
    assert settled(v, more, less) and self_check({p: BS / t for p, t in v.fitted.items()}, v, 0, False) == []
    # with 2 workers sharing the 2 cores with the step (only the ceiling and full measured)
    v = decide(by_round(ms), BS, CPU, alone=heavy(mode="shared", workers=2, load=8.0, augment=16.5, collate=0.5))
    assert v.bottleneck == "none" and v.witness == "isolated costs"
    # and in two rounds, as in one
    assert decide(by_round({"device": [2500.0, 2450.0], "full": [2560.0, 2480.0]}), BS, CPU,
                  alone=heavy(load=8.0, augment=16.5, collate=0.5)).bottleneck == "none"


def test_costs_alone_at_8pct_of_a_heavy_step_are_no_none_from_one_round():
    # 200 ms of input on the 2.5-s step: under 10% by the costs alone, but not far under
    # it: with one round nothing checks them, and they are above the 5% floor
    v = decide(by_round({"device": [2500.0], "full": [2700.0]}), BS, CPU, alone=heavy(load=80.0, augment=120.0))
    assert v.bottleneck == "inconclusive" and "no bound yet (from 1 round)" in v.reason


def test_one_round_says_none_only_where_it_agrees_with_the_costs_alone():
    costs = dict(load=8.0, augment=16.5, collate=0.5)
    # the step timed alone at 1.5 s, the loop's at 2.5: not the step the costs were compared with
    assert decide(by_round({"device": [2500.0], "full": [2560.0]}), BS, CPU,
                  alone=heavy(1500.0, **costs)).bottleneck == "inconclusive"
    # timed alone slower than the loop's (before the allocator was held: the detection
    # reference read 3.1 s a step in the loop, 4.3 alone): the loss is held against the faster
    assert decide(by_round({"device": [3100.0], "full": [3200.0]}), BS, CPU,
                  alone=heavy(4260.0, **costs)).bottleneck == "none"
    # no step timed alone (a user's loop): nothing to check the one window against
    assert decide(by_round({"device": [2500.0], "full": [2560.0]}), BS, CPU, alone=alone(**costs)).bottleneck \
        == "inconclusive"
    # the rounds' full reads 20% above the ceiling: more than one reading's tolerance over the 25 ms alone
    assert decide(by_round({"device": [2500.0], "full": [3000.0]}), BS, CPU,
                  alone=heavy(**costs)).bottleneck == "inconclusive"
    # a reading from the points past the worker stages (handoff, 150 ms) counts in the loss
    on_cpu = {"device": [2500.0], "collated": [2650.0], "full": [2700.0]}
    v = decide(by_round(on_cpu), BS, CPU, alone=heavy(mode="shared", workers=2, **costs))
    assert v.bottleneck == "inconclusive"


def test_one_round_reads_each_point_by_its_own_window_against_the_fastest_reading_of_the_step():
    costs = dict(load=3.0, augment=4.3, collate=0.005)
    # the detection reference (pp4, run 1): the ceiling's one step read 5.6 s, full's 3.4,
    # the step alone 3.75: a busy machine slowed the ceiling; full agrees with the step alone
    v = decide(by_round({"device": [5572.0], "full": [3415.0]}), BS, CPU, alone=heavy(3751.0, **costs))
    assert v.bottleneck == "none" and v.witness == "isolated costs"
    assert "the step read 5572.0 ms in the loop and 3751.0 alone, the full pipeline 3415.0 ms" in v.reason
    # (run 2) raw, doing less work, read slower than full: full's own reading, not the fit pooled with raw
    v = decide(by_round({"device": [2923.0], "raw": [3651.0], "full": [3106.0]}), BS, NO_HANDOFF,
               alone=heavy(4016.0, **costs))
    assert v.bottleneck == "none" and v.witness == "isolated costs"
    # a batch sampler's 500 ms the costs alone do not see, the ceiling read slow as full:
    # full is held against the step alone, the faster reading, and it does not agree
    v = decide(by_round({"device": [3000.0], "full": [3000.0]}), BS, CPU, alone=heavy(2500.0, **costs))
    assert v.bottleneck == "inconclusive" and v.reason.endswith(
        "; by their costs alone the worker stages add at most 7.4 ms to a step of 2500.0 ms (0.3%), but the one "
        "reading of the full pipeline, 3000.0 ms, is 16% over the two, more than the 10% one reading allows: the "
        "loop pays for something the costs alone do not see, or that reading was slowed")


def test_costs_alone_are_held_against_the_step_timed_alone_where_the_rounds_read_it_slowed():
    # the MNIST example at the default 30 s on a busy machine: the rounds read the step
    # 150 ms (their bound on the loss 25%), the step alone 68.6 ms; the costs alone 8.7 ms
    # at most: 5.5% of the rounds' step at its lower bound, 11% of the step alone
    ms = {"device": [144.3, 153.8, 150.0], "augmented": [164.6, 177.8, 166.3], "raw": [138.8, 141.1, 154.5],
          "full": [148.0, 158.7, 175.7]}
    costs = dict(load=1.92, augment=5.48, collate=0.17)
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=heavy(68.6, **costs))
    assert v.bottleneck == "inconclusive" and v.witness == "rounds"
    # the same step timed alone at 150 ms: the costs alone put the loss at 5.5%: over the 5%
    # at which a stage's cost can be real, so still no none on them
    assert decide(by_round(ms), BS, NO_HANDOFF, alone=heavy(150.0, **costs)).bottleneck == "inconclusive"
    # a loss of 2% by them, the step alone agreeing: none on the costs alone
    small = dict(load=1.0, augment=1.5, collate=0.17)
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=heavy(150.0, **small))
    assert v.bottleneck == "none" and v.witness == "isolated costs"


def test_the_shared_model_divides_the_rounds_own_gap_by_the_costs_alone():
    # 2 workers and a 2-thread step on 2 cores: the loop read 166 ms of input; alone the
    # stages cost 97, 59 and 0.4 ms of work, so k = 166 / 156.4: the loop pays more than the
    # work (its step stalls on descheduled workers), and each stage its share of that
    ms = {"device": [110] * 5, "collated": [112] * 5, "augmented": [112.4] * 5,
          "raw": [180 + w for w in WOBBLE[:5]], "full": [278] * 5}
    a = alone("shared", 2, 2, load=97.0, augment=59.0, collate=0.4)
    v = decide(by_round(ms), BS, CPU, alone=a)
    pred = v.prediction
    assert pred.k == pytest.approx(166 / 156.4, rel=0.01)
    assert v.predicted["load"][0] == pytest.approx(0.097 * pred.k) and v.predicted["augment"][0] == pytest.approx(
        0.059 * pred.k)
    assert a.describe() == "2 worker(s) share 2 cores with the step"


def test_the_costs_alone_come_from_the_isolated_record_and_say_which_model_holds():
    iso = Isolated(items_per_batch=10, load=PerSample(ms_per_sample=2.0, se_ms_per_sample=0.1, includes=("load",),
                                                      samples=40),
                   augment=PerSample(ms_per_sample=3.0, se_ms_per_sample=0.2, samples=40),
                   collate=Collate(ms_per_batch=1.0, se_ms_per_batch=0.05, batches=8),
                   workers=Workers(cores=16, step_threads=0))
    a = witness.alone(iso, {"num_workers": 4}, "cuda")
    assert a.mode == "parallel" and a.work == pytest.approx({"load": 0.02, "augment": 0.03, "collate": 0.001})
    # each stage's noise: its items' standard error and 10% of its cost for the slice it was
    # timed in (witness.SLICE_NOISE): augment 30 ms (2 and 3), collate 1 ms (0.05 and 0.1)
    augment, collate = (0.002 ** 2 + 0.003 ** 2) ** 0.5, (0.00005 ** 2 + 0.0001 ** 2) ** 0.5
    assert a.at("raw") == pytest.approx((0.031, (augment ** 2 + collate ** 2) ** 0.5))
    assert witness.alone(iso, {"num_workers": 0}, "cpu").mode == "serial"
    assert witness.alone(iso, {"num_workers": 16}, "cuda").mode == "shared"  # more workers than cores
    two = Isolated(**{**iso.__dict__, "workers": Workers(cores=2, step_threads=2)})
    assert witness.alone(two, {"num_workers": 1}, "cpu").mode == "shared"  # a 2-thread step on the 2 cores
    # the same where load waits (its CPU time a tenth of its time alone): its workers need no cores
    sleeps = Isolated(**{**two.__dict__, "load": PerSample(ms_per_sample=2.0, se_ms_per_sample=0.1, cpu_ms_per_sample=0.2,
                                                           includes=("load",), samples=40)})
    assert witness.alone(sleeps, {"num_workers": 1}, "cpu").mode == "parallel"
    assert witness.waits(sleeps) == "the workers' stages wait: CPU 10% of their time alone"
    # a load of next to nothing that reads no CPU beside an augment that computes: they compute
    # (the MONAI tutorial, whose transforms load: 2 workers, 2 cores and a CPU step shared)
    monai = Isolated(**{**two.__dict__,
                        "load": PerSample(ms_per_sample=0.13, se_ms_per_sample=0.01, cpu_ms_per_sample=0.0,
                                          includes=("load",), samples=80),
                        "augment": PerSample(ms_per_sample=2.52, se_ms_per_sample=0.1, cpu_ms_per_sample=2.56,
                                             samples=80)})
    assert witness.waits(monai) == "" and witness.alone(monai, {"num_workers": 2}, "cpu").mode == "shared"
    # the step timed alone before the points, kept beside the device point's figure
    timed = Isolated(**{**iso.__dict__, "step": StepTime(ms_per_batch=2500.0, alone_ms_per_batch=2400.0)})
    assert witness.alone(timed, {"num_workers": 0}, "cpu").step == pytest.approx(2.4)
    assert witness.alone(iso, {"num_workers": 0}, "cpu").step is None
    # a document written before the standard errors were kept: no second witness
    old = Isolated(items_per_batch=10, load=PerSample(ms_per_sample=2.0), collate=Collate(ms_per_batch=1.0))
    assert witness.alone(old, {"num_workers": 0}, "cpu") is None


def test_at_num_workers_0_the_work_timed_between_steps_is_what_the_loop_pays():
    # a 3-ms step over token sequences: alone, one item after another, 64 items build in
    # 0.1 ms a batch; between steps, as the loop runs them, fetching a batch takes 0.7 ms
    iso = Isolated(items_per_batch=64, load=PerSample(ms_per_sample=0.0016, se_ms_per_sample=0.0001,
                                                      includes=("load", "augment"), samples=500),
                   collate=Collate(ms_per_batch=0.10, se_ms_per_batch=0.01, batches=8),
                   in_loop=InLoop(batches=40, fetch_ms_per_batch=0.7, fetch_se_ms=0.02, collate_ms_per_batch=0.15,
                                  collate_se_ms=0.01),
                   workers=Workers(cores=2, step_threads=2))
    a = witness.alone(iso, {"num_workers": 0}, "cpu")
    assert a.mode == "serial" and a.in_loop and a.merged
    assert a.work == pytest.approx({"load": 0.0007, "collate": 0.00015})
    assert a.se["load"] == pytest.approx(((0.02e-3) ** 2 + (0.1 * 0.7e-3) ** 2) ** 0.5)
    assert a.samples == 40 and a.describe().endswith("timed between its steps")
    # with augment timed apart, fetching holds it: load is the rest
    split = Isolated(**{**iso.__dict__, "load": PerSample(ms_per_sample=0.0006, se_ms_per_sample=0.0001,
                                                          includes=("load",), samples=500),
                        "augment": PerSample(ms_per_sample=0.001, se_ms_per_sample=0.0001, samples=500)})
    b = witness.alone(split, {"num_workers": 0}, "cpu")
    assert b.work["load"] == pytest.approx(0.0007 - 0.064e-3) and b.work["augment"] == pytest.approx(0.064e-3)
    # the rounds' load of 0.6 ms a batch on a 3.5-ms loop is what it costs between steps: named, both witnesses
    ms = {"device": [3.0, 3.02, 2.98, 3.01, 2.99, 3.0], "augmented": [3.15, 3.16, 3.14, 3.15, 3.16, 3.14],
          "full": [3.75, 3.77, 3.73, 3.76, 3.74, 3.75]}
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=a)
    assert v.bottleneck == "load" and v.witness == "both" and not v.disagree
    # the same rounds against the tight loop's 0.1 ms: a disagreement, the readings steady
    tight = witness.alone(Isolated(**{**iso.__dict__, "in_loop": None}), {"num_workers": 0}, "cpu")
    assert not tight.in_loop and tight.work["load"] == pytest.approx(0.0016 * 64 / 1e3)
    assert decide(by_round(ms), BS, NO_HANDOFF, alone=tight).disagree
    # with workers, they do that work in processes of their own: the stages alone, as before
    assert not witness.alone(iso, {"num_workers": 1}, "cpu").in_loop


def test_an_inconclusive_run_whose_costs_alone_show_a_loss_names_their_leader():
    # the MONAI tutorial on 2 cores: 2 workers and a 2-thread step share them; one-second
    # steps that wobble by 20%, five rounds: the rounds cannot tell the loss. Alone its
    # stages cost 90 ms of work a batch, at least half of it on top of the step (the cores
    # shared perfectly), 6% of the loop: input-bound, augment far first
    ms = {"device": [620, 760, 560, 700, 600], "collated": [700, 600, 680, 560, 720],
          "augmented": [640, 690, 580, 760, 620], "raw": [720, 600, 650, 700, 600],
          "full": [700, 640, 820, 610, 760]}
    assert decide(by_round(ms), BS, CPU).bottleneck == "inconclusive"
    v = decide(by_round(ms), BS, CPU, alone=alone("shared", 2, 2, load=6.6, augment=83.0, collate=0.2))
    assert v.bottleneck == "augment" and v.witness == "isolated costs"
    assert v.reason == ("the pipeline loses at least 44.1 ms per batch to input by its worker stages' costs alone (6% "
                        "of 700.0 ms, as the loop would pay it: 2 worker(s) share 2 cores with the step), and the "
                        "rounds, which cannot tell yet, read 41.3 ms; by the costs alone augment costs the loop 41.5 "
                        "ms per batch against load's 3.3")
    # the rounds reading less than that beyond their noise: no such claim
    flat = {p: [660 + (3 if p == "full" else 0)] * 5 for p in ms}
    assert decide(by_round(flat), BS, CPU, alone=alone("shared", 2, 2, load=6.6, augment=83.0, collate=0.2)).bottleneck \
        != "augment"


def test_input_costs_the_stages_alone_do_not_have_are_not_a_stage():
    # a step-bound MLP whose step drifted while the points were measured: the rounds read
    # load 12.8 ms, beyond their noise, where alone it costs 0.3 and the whole input 1.5 ms
    # of a 110-ms step: not a stage, not a tie
    ms = {"device": [100.0, 100.5, 99.5, 100.2], "augmented": [100.1, 100.4, 99.8, 100.0],
          "raw": [100.2, 100.3, 99.7, 100.1], "full": [112.8, 113.1, 112.6, 113.0]}
    assert decide(by_round(ms), BS, NO_HANDOFF).bottleneck == "load"  # the rounds alone
    v, more, less = three(ms, alone(load=0.3, augment=0.05, collate=1.2))
    assert v.bottleneck == "inconclusive" and v.witness == "disagree" and v.disagree[0] == "load"
    assert "load reads 12.8 ms per batch in the loop where alone it costs 0.3" in v.reason
    assert not settled(v, more, less)
    # the same in each of the 4 rounds: not a drift, and the reason does not say one
    assert "drift" not in v.reason.replace("not a drift", "") and "so in each of 4 rounds" in v.reason
    assert "the loop pays for more than the stages' own work, and the stages timed alone miss it" in v.reason


def test_a_reading_that_swings_round_by_round_above_its_cost_alone_is_named_a_drift():
    # the step slows through each round and the rounds alternate their direction: full's
    # extra time swings 8-15 ms round by round, beyond the noise pooled over the points,
    # but its own per-round values do not hold it: a drift, as the reason says
    ms = {"device": [100.0, 100.2, 99.9, 100.1], "augmented": [100.1, 100.3, 99.9, 100.2],
          "raw": [100.2, 100.3, 100.0, 100.2], "full": [114.0, 108.0, 115.0, 109.0]}
    v, more, less = three(ms, alone(load=0.3, augment=0.05, collate=1.2))
    assert v.bottleneck == "inconclusive" and v.disagree and not settled(v, more, less)
    assert v.reason.endswith("the step drifted while the points were measured, or another program slowed some of them")


def test_where_the_witnesses_disagree_on_a_streaming_load_the_reason_says_what_the_iterator_adds():
    # MosaicML's CIFAR-10 notebook: load reads 19.5 ms a batch in the loop; alone, through
    # its iterator in a worker, 6.0; by index (get_item), 4.0; augment 3.0 in the loop, 10 alone
    iso = Isolated(items_per_batch=10, load=PerSample(ms_per_sample=0.6, se_ms_per_sample=0.01, includes=("load",),
                                                      samples=200, index_ms_per_sample=0.4),
                   augment=PerSample(ms_per_sample=1.0, se_ms_per_sample=0.01, samples=200),
                   collate=Collate(ms_per_batch=0.2, se_ms_per_batch=0.01, batches=8))
    a = witness.alone(iso, {"num_workers": 0}, "cpu")
    assert a.index_load == pytest.approx(0.004) and a.work["load"] == pytest.approx(0.006)
    ms = {"device": [30.0, 30.1, 29.9, 30.0], "augmented": [30.3, 30.4, 30.2, 30.3],
          "raw": [33.3, 33.4, 33.2, 33.3], "full": [52.8, 52.9, 52.7, 52.8]}
    v = decide(by_round(ms), BS, NO_HANDOFF, alone=a)
    assert v.witness == "disagree" and "load" in v.disagree
    assert ("load reads 19.5 ms per batch in the loop where alone it costs 6.0 (through its iterator in a worker; by "
            "index, get_item costs 4.0 ms a batch: the iterator 2.0 more)") in v.reason
