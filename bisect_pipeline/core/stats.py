"""Pure statistics over timed windows: no clock, no torch.

Why one module: the statistics every layer uses: windows and throughputs, Student's t,
and the one comparison that decides every difference (`compare`); the noise of the
rounds' table is noise.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from typing import Mapping, Optional, Sequence

# A point whose windows disagree by more than this (IQR / median of throughput) is
# flagged as noisy: 10% is where torch.utils.benchmark starts warning too, and
# below it a 5-window median is stable to a few percent on a shared 2-core machine.
NOISY_REL_IQR = 0.10
# Gaussian constants: IQR = 1.349 sigma; the median of n draws has standard error
# sqrt(pi/2) sigma / sqrt(n) = 1.2533 sigma / sqrt(n).
IQR_PER_SIGMA = 1.349
MEDIAN_SE_FACTOR = 1.2533

# The one rule for "is this difference real?", used by the verdict, the advice, compare
# and the sweep. A difference is real only if it exceeds Z_NOISE combined standard errors
# (about a 1-in-700 false alarm for Gaussian noise) ...
Z_NOISE = 3.0
# ... and also MIN_REL_DROP of the reference (the full pipeline's time per batch for a
# stage). Window-to-window spread misses slow drift on a shared machine, which we have
# seen reach a few percent between points measured seconds apart; 5% is also the "not
# input-bound" threshold of the TensorFlow input-pipeline analyzer, so smaller drops are
# not worth acting on.
MIN_REL_DROP = 0.05


# Student's t at the one-sided level of Z_NOISE (99.865%) for 1..30 degrees of freedom
# (computed with mpmath's regularized incomplete beta; beyond 30 the Cornish-Fisher
# expansion below agrees to 1e-3). A standard error estimated from a few windows is
# itself uncertain: Z_NOISE of it would raise false alarms far more often than 1 in 700.
_T_AT_Z_NOISE = (235.801, 19.207, 9.219, 6.62, 5.507, 4.904, 4.53, 4.277, 4.094, 3.957, 3.85, 3.764, 3.694,
                 3.636, 3.586, 3.544, 3.507, 3.475, 3.447, 3.422, 3.4, 3.38, 3.361, 3.345, 3.33, 3.316, 3.303,
                 3.291, 3.28, 3.27)


def small_sample_factor(n: int) -> float:
    """How much a standard error estimated from `n` windows grows so that Z_NOISE of it
    keeps Z_NOISE's false-alarm rate: t(n - 1) / z (Student's t). 1.8 at 6 windows, 1.3
    at 12, 1.1 at 31; infinite for one window (no estimate of the noise at all)."""
    return t_factor(n - 1)


def t_factor(df: float) -> float:
    """t / z at Z_NOISE's level for a spread estimated with `df` degrees of freedom
    (math.inf: a spread known exactly, 1)."""
    if df < 1:
        return math.inf
    if df == math.inf:
        return 1.0
    df = int(df)
    if df <= len(_T_AT_Z_NOISE):
        return _T_AT_Z_NOISE[df - 1] / Z_NOISE
    z = Z_NOISE
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)) / z


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function at `x` with `df` degrees of freedom."""
    if df == math.inf:
        return normal_cdf(x)
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom, 0.5 <= p < 1
    (bisection on t_cdf; math.inf for df < 1: no spread, no bound). Cached: a verdict is
    decided three times a round (verdict.settled) with the same few levels and degrees of
    freedom, and each bisection costs a few milliseconds."""
    if df < 1:
        return math.inf
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-10 * hi:
            break
    return (lo + hi) / 2.0


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f / a


# Which of two is the larger, or the faster (the verdict's costliest stage over another,
# a setting over the user's in the advice's check and in --tune, a run over another in
# compare), is asked only once there is something to choose between, and is decided at
# 97.7% one-sided: Student's t at that level and the degrees of freedom of the
# difference's noise, times its standard error (Contrast.widened), and never below
# MIN_REL_DROP of the reference. One function says it for every caller: `compare`.
Z_LEAD = 2.0
# A difference whose noise leans on the noise pooled over other points of a table (a
# Noise of many points) and comes from fewer rounds than this is asked at Z_NOISE instead:
# that pooled noise reads low on small tables (residual_noise), and at 3 rounds it named a
# wrong stage (docs/benchmarks.md, issue 30: which stage leads, at 97.7%). A difference
# whose noise is its own paired values' (the two sides of a trial, Student's t at their
# degrees of freedom) needs no such margin: t is the margin.
FEW_ROUNDS = 4


def level(c: "Contrast") -> float:
    """The z a difference is asked at (see Z_LEAD, FEW_ROUNDS): Z_NOISE where its noise
    was pooled over other points from fewer than FEW_ROUNDS rounds, or comes from
    windows without rounds (a document of schema 1); else Z_LEAD."""
    if c.rounds is None or (c.pooled and c.rounds < FEW_ROUNDS):
        return Z_NOISE
    return Z_LEAD


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The one answer to "is this larger (or faster) than that, beyond the noise?"
    (`compare`): the difference, its noise widened at the level it is asked at (`z`,
    `level`), the least difference that is real there (noise_threshold), whether this
    one is, and the rounds (pairs) and degrees of freedom its noise came from."""

    estimate: float
    sigma: float
    threshold: float
    z: float
    real: bool
    rounds: Optional[int] = None
    df: float = math.inf

    @property
    def low(self) -> float:
        """The interval's lower end at the level asked (estimate - z * sigma)."""
        return self.estimate - self.z * self.sigma

    @property
    def high(self) -> float:
        return self.estimate + self.z * self.sigma


def compare(c: "Contrast", reference: float, *, scale: float = 1.0,
            bound: Sequence["Contrast"] = (), z: Optional[float] = None) -> Comparison:
    """Is the difference `c` (positive: the first term larger) real? Asked at `level(c)`,
    its standard error widened for its degrees of freedom there (Contrast.widened), at
    most the sum of the noise of `bound` widened alike (sd(a - b) <= sd(a) + sd(b): the
    two costs a lead is the difference of), against noise_threshold at `reference`
    (MIN_REL_DROP of it at least) with `scale` more noise (stopping early asks for a
    margin). One-sided: `real` says the estimate is beyond the threshold in its own
    direction (abs: a comparison of two settings asks both ways, each at 97.7%). `z`:
    asked at that level instead (the verdict holds a reading against its prediction at
    the noise rule's, Z_NOISE: "the rounds are suspect" is the stronger claim)."""
    z = level(c) if z is None else z
    sigma = c.widened(z)
    if bound:
        sigma = min(sigma, sum(b.widened(z) for b in bound))
    threshold = noise_threshold(sigma, reference, scale, z)
    return Comparison(c.estimate, sigma, threshold, z, abs(c.estimate) > threshold, c.rounds, c.df)


def paired(a: Sequence[float], b: Sequence[float]) -> "Contrast":
    """The log of b over a from measurements taken in alternation: pair i is a[i] and
    b[i], measured next to each other (a drift of the machine over the pairs weighs on
    both alike and cancels in each pair's log ratio). The estimate is the mean of the
    pairs' log ratios, its standard error their standard deviation over sqrt(pairs), with
    pairs - 1 degrees of freedom (Student's paired t); pairs with a side missing or not
    positive are left out. Its `own_se` is its se: the noise is the pairs' own."""
    logs = [math.log(y / x) for x, y in zip(a, b) if x and y and x > 0 and y > 0
            and math.isfinite(x) and math.isfinite(y)]
    n = len(logs)
    if n == 0:
        return Contrast(math.nan, math.inf, 0, 0)
    mean = statistics.fmean(logs)
    if n < 2:
        return Contrast(mean, math.inf, 0, 1)
    se = mean_se(logs)
    return Contrast(mean, se, n - 1, n, se)


def unpaired(a: Sequence[float], b: Sequence[float]) -> "Contrast":
    """The log of a's mean over b's from two runs not taken in alternation (compare,
    --sweep): the difference of the mean logs, its standard error both samples' (their
    variances over their counts), at Welch's degrees of freedom. What drifts between the
    runs is not paired out: that is the cost of not alternating, and the MIN_REL_DROP
    floor of compare stands for it. Values not positive are left out; fewer than two on
    a side: no spread."""
    xs = [math.log(x) for x in a if x and x > 0 and math.isfinite(x)]
    ys = [math.log(y) for y in b if y and y > 0 and math.isfinite(y)]
    if not xs or not ys:
        return Contrast(math.nan, math.inf, 0, None)
    estimate = statistics.fmean(xs) - statistics.fmean(ys)
    if len(xs) < 2 or len(ys) < 2:
        return Contrast(estimate, math.inf, 0, min(len(xs), len(ys)))
    va, vb = (statistics.variance(v) / len(v) for v in (xs, ys))
    se = math.sqrt(va + vb)
    if se == 0:
        return Contrast(estimate, 0.0, math.inf, min(len(xs), len(ys)), 0.0)
    df = (va + vb) ** 2 / ((va ** 2 / (len(xs) - 1) if va else 0.0) + (vb ** 2 / (len(ys) - 1) if vb else 0.0))
    return Contrast(estimate, se, df, min(len(xs), len(ys)), se)


def mean_se(values: Sequence[float]) -> float:
    """The standard error of the mean of `values`: their standard deviation over
    sqrt(n) (two at least)."""
    return statistics.stdev(values) / math.sqrt(len(values))


def difference(a: "Contrast", b: "Contrast") -> "Contrast":
    """a - b for two contrasts measured apart (each its own pairs: two trials against the
    same reference, a stage's cost in two runs): their errors combined, at the fewer
    degrees of freedom and rounds (None where either's are not known)."""
    rounds = None if a.rounds is None or b.rounds is None else min(a.rounds, b.rounds)
    return Contrast(a.estimate - b.estimate, math.hypot(a.se, b.se), min(a.df, b.df), rounds)


def noise_threshold(sigma: float, reference: float, scale: float = 1.0, z: float = Z_NOISE) -> float:
    """The smallest difference that is real: max(z * sigma, MIN_REL_DROP * reference),
    `sigma` widened for z's level (Contrast.widened). `scale` > 1 asks for a margin: the
    difference must stay real with that much more noise."""
    return max(z * sigma * scale, MIN_REL_DROP * reference)


def is_real(diff: float, sigma: float, reference: float, scale: float = 1.0) -> bool:
    """Is `diff` (same unit as `reference`) beyond the noise? See noise_threshold."""
    return diff > noise_threshold(sigma, reference, scale)


def decreasing_blocks(values: Sequence[float], weights: Sequence[float]) -> list:
    """The weighted least-squares fit of `values` that never increases (pool adjacent
    violators), as its blocks: lists of consecutive indices whose values are pooled to
    their weighted mean (one index where a value keeps its own). For times per batch
    listed from the point that does the most work to the one that does the least, it is
    the estimate that respects the physics: a point never costs more than one that does
    all of its work and more. Each fitted value is thus a linear combination of the
    values, and a difference of fitted values a contrast whose noise can be estimated
    like any other (drops.fit)."""
    blocks: list = []  # [mean, weight, indices]
    for i, (v, w) in enumerate(zip(values, weights)):
        blocks.append([float(v), float(w), [i]])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2, i2 = blocks.pop()
            m1, w1, i1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, i1 + i2])
    return [b[2] for b in blocks]


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), 0 <= q <= 1."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def iqr(values: Sequence[float]) -> float:
    return quantile(values, 0.75) - quantile(values, 0.25)


def median_se(values: Sequence[float]) -> float:
    """Standard error of the median of `values`, the one estimate every "is it real" in
    the tool uses: IQR/1.349 estimates the values' standard deviation (exact for Gaussian
    noise), the median of n values has about 1.2533 sigma/sqrt(n) standard error, and
    the whole is scaled by small_sample_factor(n), since the spread itself comes from n
    values. Infinite for fewer than two (one value says nothing about the noise)."""
    n = len(values)
    if n < 2:
        return math.inf
    return MEDIAN_SE_FACTOR * (iqr(values) / IQR_PER_SIGMA) / math.sqrt(n) * small_sample_factor(n)


# From this many values on, a median's standard error is at least what the values' own
# order says (order_se): below it the interval's ends are the extreme values (k = 0 or
# 1), a range, not an error.
ORDER_SE_MIN_N = 8


def order_se(values: Sequence[float]) -> float:
    """A standard error of the median of `values` that assumes no shape: half the width
    of the order-statistic interval [x(k), x(n-1-k)], k = floor((n - sqrt n) / 2), which
    holds the median with the probability of +-1 standard error (the sign test's
    interval, normal approximation). Where the values are Gaussian it is median_se's
    figure; where they fall in two clusters (a step that alternates between two speeds
    from one round to the next) it spans both, while the IQR-based figure takes the
    median of one cluster as known to within its own spread. 0 below ORDER_SE_MIN_N."""
    n = len(values)
    if n < ORDER_SE_MIN_N:
        return 0.0
    x = sorted(values)
    k = int((n - math.sqrt(n)) // 2)
    return (x[n - 1 - k] - x[k]) / 2.0


def point_sigmas(measured: Mapping[str, "Throughput"]) -> dict:
    """Each point's standard error of seconds per batch, as every comparison of points
    of one run uses it: its own (Throughput.sec_per_batch_sigma), or, where smaller, one
    from the machine's noise pooled over every point's windows. A point of two or three
    windows has almost no spread estimate of its own (t at one degree of freedom is 78 z),
    so a long step, measured in few windows, would get bounds many times its batch time
    however well its windows agree. Pooled: the windows' relative spread is the
    machine's, alike at every point (the sample variance of log-rates about each point's
    mean, over sum(n - 1) degrees of freedom); a point whose own windows spread more
    keeps its own spread; the t factor is the pooled degrees of freedom's."""
    parts = {name: _log_ss(tp) for name, tp in measured.items()}
    ss, df = sum(p[0] for p in parts.values()), sum(p[1] for p in parts.values())
    pooled = math.sqrt(ss / df) if df else math.inf
    out = {}
    for name, tp in measured.items():
        own = tp.sec_per_batch_sigma
        if df >= 1 and tp.n >= 1:
            own_ss, own_df = parts[name]
            spread = max(pooled, math.sqrt(own_ss / own_df) if own_df else 0.0)
            own = min(own, tp.sec_per_batch * spread * MEDIAN_SE_FACTOR / math.sqrt(tp.n) * t_factor(df))
        out[name] = own
    return out


def _log_ss(tp: "Throughput") -> tuple[float, int]:
    """The sum of squared deviations of a point's log-rates about their mean, and its
    degrees of freedom (one less than its windows)."""
    logs = [math.log(r) for r in tp._rates() if 0 < r < math.inf]
    if len(logs) < 2:
        return 0.0, 0
    mean = sum(logs) / len(logs)
    return sum((x - mean) ** 2 for x in logs), len(logs) - 1


# Windows are kept to the microsecond, the precision of the JSON document, so a report
# loaded from its document derives exactly the numbers it was written with.
WINDOW_DECIMALS = 6


@dataclasses.dataclass(frozen=True)
class Window:
    """One timed window: `steps` training steps took `seconds` of wall clock, in round
    `round` of the paired rounds (rounds.Rounds; None where the schedule has no rounds:
    torchrun's single pass, a document of schema 1)."""

    steps: int
    seconds: float
    round: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", round(float(self.seconds), WINDOW_DECIMALS))

    @property
    def steps_per_sec(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Raw windows of one point; every statistic is derived from them.

    Throughput is total steps over total time per window (never a median of per-step
    times, which a bursty producer such as a multi-worker loader makes wrong).
    """

    windows: tuple[Window, ...]
    batch_size: int

    def _rates(self) -> list[float]:
        return [w.steps_per_sec * self.batch_size for w in self.windows]

    @property
    def n(self) -> int:
        return len(self.windows)

    def round_times(self) -> dict:
        """Seconds per batch in each round the point was measured in: its windows' total
        time over their total steps (None: windows without a round)."""
        seconds: dict = {}
        steps: dict = {}
        for w in self.windows:
            seconds[w.round] = seconds.get(w.round, 0.0) + w.seconds
            steps[w.round] = steps.get(w.round, 0) + w.steps
        return {r: seconds[r] / steps[r] for r in seconds if steps[r]}

    def times(self) -> list:
        """Seconds per batch in each round (round_times) where the windows carry two
        rounds or more, else in each window: the values two runs are compared on
        (unpaired: compare, --sweep)."""
        rounds = self.round_times()
        if len(rounds) >= 2 and None not in rounds:
            return list(rounds.values())
        return [w.seconds / w.steps for w in self.windows if w.steps > 0]

    @property
    def samples_per_sec(self) -> float:
        return median(self._rates())

    @property
    def iqr(self) -> float:
        return iqr(self._rates())

    @property
    def rel_iqr(self) -> float:
        """Spread relative to the median: 0.05 means windows agree within about 5%."""
        med = self.samples_per_sec
        return self.iqr / med if med > 0 else math.inf

    @property
    def sec_per_batch(self) -> float:
        return self.batch_size / self.samples_per_sec

    @property
    def rel_se(self) -> float:
        """Standard error of the median throughput (median_se), relative to it."""
        if self.n < 2:
            return math.inf  # one window says nothing about the noise (0 * inf would be nan)
        med = self.samples_per_sec
        return median_se(self._rates()) / med if med > 0 else math.inf

    @property
    def sec_per_batch_sigma(self) -> float:
        """Standard error of `sec_per_batch` (relative errors of b/r and r are equal)."""
        return self.sec_per_batch * self.rel_se

    @property
    def noisy(self) -> bool:
        return self.rel_iqr > NOISY_REL_IQR

    @property
    def steps(self) -> int:
        return sum(w.steps for w in self.windows)

    @property
    def seconds(self) -> float:
        return sum(w.seconds for w in self.windows)


@dataclasses.dataclass(frozen=True)
class Contrast:
    """A difference of points' times per batch (a stage's cost, a lead between two
    stages, the gap): its estimate, its standard error, and the degrees of freedom the
    error was estimated with; `rounds` the rounds it was paired over (None: from the
    windows, rounds unknown); `own_se`, the standard error its own per-round values give
    (Noise.contrast: their spread, IQR / 1.349, at least their order statistics'), where
    `se` may come from the noise pooled over the points: what a projection to more rounds
    keeps (drops.rounds_to_tell); nan where unknown. `pooled`: `se` is that pooled noise,
    borrowed from other points (see level)."""

    estimate: float
    se: float
    df: float
    rounds: Optional[int] = None
    own_se: float = math.nan
    # the noise leans on the one pooled over other points of the table (Noise.contrast):
    # asked at Z_NOISE over fewer than FEW_ROUNDS rounds (level)
    pooled: bool = False

    @property
    def sigma(self) -> float:
        """The standard error widened for its degrees of freedom (t_factor), so that
        Z_NOISE of it keeps Z_NOISE's false-alarm rate: the noise every rule compares with."""
        return self.se * t_factor(self.df) if math.isfinite(self.se) else math.inf

    def widened(self, z: float) -> float:
        """The standard error widened for its degrees of freedom at z's one-sided level,
        so that z of it is Student's bound there: t(df) at normal_cdf(z) / z * se
        (`sigma` is widened(Z_NOISE))."""
        if not math.isfinite(self.se):
            return math.inf
        return self.se * t_quantile(normal_cdf(z), self.df) / z

    def upper(self, z: float, scale: float = 1.0) -> float:
        """The one-sided upper bound at normal_cdf(z) confidence: estimate + t(df) se."""
        if not math.isfinite(self.se):
            return math.inf
        return self.estimate + t_quantile(normal_cdf(z), self.df) * self.se * scale
