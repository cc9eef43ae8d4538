"""Intervals over seeds and items, paired comparisons, and the evaluation size they need.

Pure numpy (and the standard library), no JAX: what `experiments.seeds report` computes
from the per-item outcome files. An outcome table is a list with one float array per
training seed, `[items]` each (success 0/1, or a reward), its columns the same items in
the same order (the held-out set does not depend on the training seed).

The point estimate is the mean over seeds of each seed's mean over items. Its interval is
a two-level (hierarchical) percentile bootstrap: resample the seeds with replacement,
then each drawn seed's items with replacement, and take the 2.5th and 97.5th percentiles
of the replicates' means. Resampling both levels covers both sources of noise: another
training seed gives another policy, another draw of held-out items another score. It
is conservative when seeds do not differ (both levels add the item noise: up to about
1.4x wide, 99% coverage for a 95% interval in simulation), and
with 2-3 seeds the seed level is only roughly estimated: say how many seeds an interval
rests on.

A paired comparison evaluates two configs on the same items: the difference of their
means, a bootstrap interval that resamples items jointly (the pairing) and each
config's seeds apart, and a sign-flip permutation p-value on the per-item differences.
The p-value holds the trained policies fixed (the items are its only randomness): it asks
whether these seeds' policies differ on such items, not whether another set of seeds
would. With 2-3 seeds a side, read the interval, which resamples the seeds too.
"""

import math
import statistics

import numpy as np

DRAWS = 2000  # bootstrap replicates
PERMUTATIONS = 10_000  # sign flips of the paired test
SEED = 0  # the bootstrap's generator seed: the same outcomes give the same report


def _check(table, name: str = "outcomes") -> list[np.ndarray]:
  table = [np.asarray(x, np.float64) for x in table]
  if not table or any(x.ndim != 1 or x.size == 0 for x in table):
    raise ValueError(f"{name}: need >= 1 seed, each a non-empty [items] array")
  return table


def seed_item_means(table, draws: int, rng: np.random.Generator) -> np.ndarray:
  """[draws] means of `table` with its seeds, then each drawn seed's items, resampled
  (each drawn seed's items resampled apart, even when a seed is drawn twice)."""
  table = _check(table)
  S = len(table)
  pick = rng.integers(S, size=(draws, S))
  means = np.empty((draws, S))
  for j in range(S):
    for s in range(S):
      rows = pick[:, j] == s
      n = table[s].size
      means[rows, j] = table[s][rng.integers(n, size=(int(rows.sum()), n))].mean(1)
  return means.mean(1)


def mean_interval(table, level: float = 0.95, draws: int = DRAWS, seed: int = SEED) -> dict:
  """{"mean", "lo", "hi", "seeds", "items"}: the mean over seeds of each seed's mean over
  items, and its two-level bootstrap interval (module docstring)."""
  table = _check(table)
  rep = seed_item_means(table, draws, np.random.default_rng(seed))
  lo, hi = np.quantile(rep, [(1 - level) / 2, (1 + level) / 2])
  mean = float(np.mean([x.mean() for x in table]))
  return {
    "mean": mean,
    "lo": float(lo),
    "hi": float(hi),
    "seeds": len(table),
    "items": int(np.mean([x.size for x in table])),
  }


def paired_difference(
  a, b, level: float = 0.95, draws: int = DRAWS, permutations: int = PERMUTATIONS, seed: int = SEED
) -> dict:
  """{"difference", "lo", "hi", "p", "items"}: config `a`'s mean minus `b`'s on the same
  items (each an outcome table: [seeds] of [items], columns aligned), its bootstrap
  interval (items resampled jointly, each side's seeds apart) and the two-sided sign-flip
  permutation p-value of the per-item differences (seed-averaged). Identical tables give
  difference 0 and p = 1; swapping `a` and `b` flips the sign."""
  a, b = _check(a, "a"), _check(b, "b")
  n = a[0].size
  if any(x.size != n for x in a + b):
    raise ValueError(
      f"a and b must hold the same items for every seed; sizes {[x.size for x in a + b]}"
    )
  A, B = np.stack(a), np.stack(b)  # [seeds, items]
  rng = np.random.default_rng(seed)
  items = rng.integers(n, size=(draws, n))  # one item resample per replicate, both sides
  rep = np.empty(draws)
  for r in range(draws):
    rep[r] = side_mean(side_row(A, rng), items[r]) - side_mean(side_row(B, rng), items[r])
  lo, hi = np.quantile(rep, [(1 - level) / 2, (1 + level) / 2])
  d = A.mean(0) - B.mean(0)  # [items]
  return {
    "difference": float(d.mean()),
    "lo": float(lo),
    "hi": float(hi),
    "p": sign_flip_p(d, permutations, rng),
    "items": n,
  }


def side_row(M: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """M's seeds (rows) resampled with replacement."""
  return M[rng.integers(len(M), size=len(M))]


def side_mean(M: np.ndarray, items: np.ndarray) -> float:
  """The mean of M's columns `items` (a resample of the items)."""
  return float(M[:, items].mean())


def sign_flip_p(d: np.ndarray, permutations: int, rng: np.random.Generator) -> float:
  """Two-sided p-value that the per-item differences `d` [items] are centred on 0: the share
  of random sign flips whose mean is at least as far from 0 as the observed one (counting
  the observed; all-zero differences give 1)."""
  d = np.asarray(d, np.float64)
  observed = abs(d.mean())
  signs = rng.choice(np.array([-1.0, 1.0]), size=(permutations, d.size))
  flipped = np.abs(signs @ d / d.size)
  hits = int(np.sum(flipped >= observed - 1e-12))
  return (1 + hits) / (1 + permutations)


def items_per_arm(p1: float, p2: float, alpha: float = 0.05, power: float = 0.8) -> int:
  """Items per arm for a two-sided two-proportion z-test at level `alpha` to detect
  success rates p1 vs p2 with probability `power` (the normal approximation with the
  pooled variance under the null). 0.6 vs 0.7 at 0.05 and 0.8: 356. A paired comparison
  on the same items needs fewer when items differ in difficulty; seeds add variance."""
  if not (0 < p1 < 1 and 0 < p2 < 1 and p1 != p2):
    raise ValueError(f"p1={p1}, p2={p2}: need two different rates in (0, 1)")
  z = statistics.NormalDist().inv_cdf
  pooled = (p1 + p2) / 2
  spread = z(1 - alpha / 2) * math.sqrt(2 * pooled * (1 - pooled))
  spread += z(power) * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))
  return math.ceil((spread / (p1 - p2)) ** 2)
