"""The noise of the rounds: a table of seconds per batch, point by round, fitted by median
polish in logs (each round's shared factor taken out), and each contrast between points
(a stage's cost, a lead, the gap) with the standard error its per-round values give.
The statistics over windows and the one comparison these feed are stats.py."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .stats import (Contrast, IQR_PER_SIGMA, MEDIAN_SE_FACTOR, Throughput, iqr, median, median_se, order_se,
                    point_sigmas, small_sample_factor)


class Noise:
    """The points' times per batch and the noise of any contrast between them.

    Paired (every window carries its round): a point's time in a round is its windows'
    total time over their steps, t[p][r]. The times are fitted as t[p][r] = mu[p] * f[r]
    over the cells measured, by medians of their logs (Tukey's median polish, as a
    point's windows are summed up by their median: a burst of a busy machine that slows
    one visit moves neither): f[r] is what a round shares at every point (a busy CPU
    slows every step by a factor for a while; their median is 1), mu[p] the point's time
    with it taken out. A contrast sum(c[p] t[p]) (sum c = 0) takes its noise from its
    per-round values v[r] = sum(c[p] t[p][r]) / f[r] over the rounds that measured all of
    its points, by the one rule of the windows (median_se: IQR / 1.349 as the spread,
    1.2533 / sqrt(n) for a median) with n - 1 degrees of freedom. What the points share
    within a round cancels in v; a drift between the visits of one round does not, and
    shows in the spread of v (rounds alternate their direction, so its sign flips from
    one round to the next). As point_sigmas does for windows, a few rounds also take the
    noise pooled over the points: the spread of the polish's residuals (relative, with
    cells - points - rounds + 1 degrees of freedom; residual_noise) scaled to the contrast, or the
    contrast's own spread where larger; whichever error is the smaller once widened for
    its degrees of freedom.

    Windows without rounds (a document of schema 1, torchrun's single pass): the point's
    time is its windows' median and a contrast's noise combines the points' own
    (point_sigmas), as those documents were decided."""

    def __init__(self, measured: Mapping[str, "Throughput"]) -> None:
        self.cells = {p: tp.round_times() for p, tp in measured.items()}
        self.paired = bool(self.cells) and all(c and None not in c for c in self.cells.values())
        if self.paired:
            logs = {p: {r: math.log(t) for r, t in c.items()} for p, c in self.cells.items()}
            mu, drift = median_polish(logs)
            self.mu = {p: math.exp(m) for p, m in mu.items()}
            self.factor = {r: math.exp(b) for r, b in drift.items()}
            residuals = [x - mu[p] - drift[r] for p, c in logs.items() for r, x in c.items()]
            self.pooled_df = len(residuals) - len(mu) - len(drift) + 1
            self.pooled = residual_noise(residuals, self.pooled_df)
        else:
            self.mu = {p: tp.sec_per_batch for p, tp in measured.items()}
            self.factor, self.pooled, self.pooled_df = {}, math.inf, 0
            self._sigmas = point_sigmas(measured)

    def time(self, point: str) -> float:
        return self.mu[point]

    def rounds(self, point: str) -> int:
        """The rounds the point was measured in (0 without rounds)."""
        return len(self.cells[point]) if self.paired else 0

    def point_sigma(self, point: str) -> float:
        """A point's standard error (weights of the ordered fit): the spread of its round
        times with the rounds' shared factor taken out, and never less than the machine's
        noise pooled over every point (the polish's residuals) at its number of rounds:
        a point measured in few rounds that happened to agree is not known better than
        the machine lets any point be known."""
        if not self.paired:
            return self._sigmas[point]
        values = [t / self.factor[r] for r, t in self.cells[point].items()]
        own = median_se(values)
        if not math.isfinite(self.pooled):
            return own
        return max(own, self.pooled * self.mu[point] * MEDIAN_SE_FACTOR / math.sqrt(len(values)))

    def contrast(self, coef: Mapping[str, float]) -> Contrast:
        """sum(coef[p] * t[p]) and its noise (see the class)."""
        coef = {p: c for p, c in coef.items() if c}
        estimate = sum(c * self.mu[p] for p, c in coef.items())
        if not self.paired:
            return Contrast(estimate, math.sqrt(sum((c * self._sigmas[p]) ** 2 for p, c in coef.items())), math.inf)
        common = set.intersection(*(set(self.cells[p]) for p in coef)) if coef else set()
        values = [sum(c * self.cells[p][r] for p, c in coef.items()) / self.factor[r] for r in sorted(common)]
        n = len(values)
        # never below what the order of its per-round values says (order_se): a median
        # polish's estimate sits on one cluster of two-cluster values, and the IQR-based
        # error would take it as known to within that cluster's spread (docs/benchmarks.md,
        # issue 30, later the same day)
        floor = order_se(values)
        own_se = max(median_se(values) / small_sample_factor(n), floor) if n >= 2 else math.inf
        own = Contrast(estimate, own_se, n - 1 if n >= 2 else 0, n, own_se)
        if n < 1 or not math.isfinite(self.pooled):
            return own
        # the machine's noise is alike at every point: its spread pooled over all of them
        # (the polish's residuals) gives a few rounds more degrees of freedom than the
        # contrast's own values; a contrast whose own values spread more keeps that spread
        spread = max(self.pooled * math.sqrt(sum((c * self.mu[p]) ** 2 for p, c in coef.items())),
                     iqr(values) / IQR_PER_SIGMA if n >= 2 else 0.0)
        # borrowed from other points only where the table has points besides the contrast's
        borrowed = len(self.mu) > len(coef)
        pooled = Contrast(estimate, max(MEDIAN_SE_FACTOR * spread / math.sqrt(n), floor), self.pooled_df, n, own_se,
                          borrowed)
        return pooled if pooled.sigma < own.sigma else own


# A residual this close to 0 is a cell the median polish fitted exactly (logs of times).
EXACT_FIT = 1e-9


def residual_noise(residuals: Sequence[float], df: int) -> float:
    """The noise of one cell (relative) from a median polish's residuals, with `df`
    degrees of freedom: their spread (IQR / 1.349, robust to a visit slowed by a burst,
    as the points' medians are), scaled to df. A polish fits a cell exactly wherever a
    point's or a round's median is that cell, and its zeros carry no spread: counted in,
    they fill the interquartile range (the ImageNet example at 2-3 rounds: 4 zeros in 9
    residuals, a noise of 0, every cost real, a wrong stage named). So the spread is
    taken over all residuals scaled by sqrt(cells / df), and over those not fitted
    exactly scaled by sqrt(their number / df), and the larger kept: the first reads low
    where zeros are many, the second where they are few. Still low on small tables (the
    polish's medians fit part of the noise), but the root mean square over df, though
    calibrated, takes a burst in full (simulated and re-decided: docs/benchmarks.md,
    issue 30, worker pools kept between visits). A table fitted exactly in all but one
    cell has no second spread: its times agree, and the first is what they show.
    inf without a degree of freedom."""
    if df < 1:
        return math.inf
    free = [r for r in residuals if abs(r) > EXACT_FIT]
    spread = iqr(residuals) * math.sqrt(len(residuals) / df)
    if len(free) >= 2:
        spread = max(spread, iqr(free) * math.sqrt(len(free) / df))
    return spread / IQR_PER_SIGMA


def median_polish(cells: Mapping[str, Mapping[int, float]], sweeps: int = 20) -> tuple[dict, dict]:
    """Tukey's median polish of x[p][r] = mu[p] + b[r] over the cells measured (x: the
    logs of the times, in Noise): the
    rounds' effects b (their median 0) and the points' mu, each the median of what the
    other leaves, swept until they settle."""
    rounds = sorted({r for c in cells.values() for r in c})
    b = {r: 0.0 for r in rounds}
    mu = {p: median(list(c.values())) for p, c in cells.items()}
    for _ in range(sweeps):
        new = {r: median([cells[p][r] - mu[p] for p in cells if r in cells[p]]) for r in rounds}
        centre = median(list(new.values()))
        new = {r: v - centre for r, v in new.items()}
        mu_new = {p: median([t - new[r] for r, t in c.items()]) for p, c in cells.items()}
        moved = max([abs(new[r] - b[r]) for r in rounds] + [abs(mu_new[p] - mu[p]) for p in cells])
        b, mu = new, mu_new
        if moved <= 1e-12 * max(abs(m) for m in mu.values()):
            break
    return mu, b
