"""experiments.intervals: two-level bootstrap intervals, paired comparisons, sample sizes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import intervals


def _table(rng, seeds, items, p, seed_sd=0.0):
  """Bernoulli outcomes: each seed's policy succeeds with p + N(0, seed_sd) on every item."""
  rates = np.clip(p + rng.normal(0, seed_sd, seeds), 0, 1)
  return [(rng.random(items) < r).astype(np.float64) for r in rates]


@pytest.mark.parametrize("seed_sd,low,high", [(0.0, 0.95, 1.0), (0.05, 0.90, 0.99)])
def test_interval_covers_the_true_rate_about_95_percent(seed_sd, low, high):
  """300 simulated evaluations (4 seeds x 200 items, true rate 0.65): with seeds spread by
  sd 0.05 the 95% interval holds 0.65 in 90-99% of them (measured 0.95); with seeds alike
  it is conservative, as the module says (measured 0.99: both levels add the item noise).
  Mutation caught: the seed level not resampled (`pick` as each seed once): 0.86 with
  spread seeds."""
  rng = np.random.default_rng(7)
  hits = [
    intervals.mean_interval(_table(rng, 4, 200, 0.65, seed_sd), draws=400, seed=r)
    for r in range(300)
  ]
  coverage = np.mean([h["lo"] <= 0.65 <= h["hi"] for h in hits])
  assert low <= coverage <= high, coverage


def test_interval_shrinks_with_more_items_and_is_reproducible():
  """4x the items: the interval about half as wide; the same outcomes, the same interval.
  Mutation caught: items not resampled (the interval only from the 3 seeds' means)."""
  rng = np.random.default_rng(3)
  few, many = _table(rng, 3, 100, 0.6), _table(rng, 3, 400, 0.6)
  width = lambda t: intervals.mean_interval(t)["hi"] - intervals.mean_interval(t)["lo"]
  assert 0.35 < width(many) / width(few) < 0.7
  assert intervals.mean_interval(few) == intervals.mean_interval(few)
  got = intervals.mean_interval(few)
  assert got["mean"] == pytest.approx(np.mean(np.concatenate(few)))
  assert got["lo"] < got["mean"] < got["hi"] and (got["seeds"], got["items"]) == (3, 100)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(2, 40), st.integers(0, 2**31))
def test_paired_comparison_of_identical_runs_is_zero_with_p_one(seeds, items, seed):
  rng = np.random.default_rng(seed)
  a = _table(rng, seeds, items, 0.5)
  got = intervals.paired_difference(a, [x.copy() for x in a], draws=200, permutations=500)
  assert got["difference"] == 0.0 and got["p"] == 1.0 and got["lo"] <= 0 <= got["hi"]


def test_paired_comparison_sign_interval_and_p_value():
  """A config 15 points better on 300 shared items: the difference near 0.15, its interval
  excludes 0, p small; swapped arguments flip the sign and the interval, same p. Mutation
  caught: `paired_difference` subtracting a from b (the sign check fails)."""
  rng = np.random.default_rng(11)
  easy = rng.random(300) < 0.5  # item difficulty shared by both configs
  a = [((rng.random(300) < 0.9) & easy | (rng.random(300) < 0.4)).astype(float) for _ in range(3)]
  b = [((rng.random(300) < 0.6) & easy | (rng.random(300) < 0.4)).astype(float) for _ in range(3)]
  ab, ba = intervals.paired_difference(a, b), intervals.paired_difference(b, a)
  truth = np.mean(a) - np.mean(b)
  assert ab["difference"] == pytest.approx(truth) and 0.08 < truth < 0.25
  assert 0 < ab["lo"] < truth < ab["hi"] and ab["p"] < 0.01
  assert ba["difference"] == pytest.approx(-truth) and ba["hi"] < 0 and ba["p"] == ab["p"]


def test_sign_flip_p_value_is_uniformish_under_the_null():
  """Per-item differences centred on 0: p < 0.05 in about 5% of 400 draws (2-9%)."""
  rng = np.random.default_rng(5)
  ps = [intervals.sign_flip_p(rng.normal(0, 1, 50), 400, rng) for _ in range(400)]
  assert 0.02 <= np.mean(np.array(ps) < 0.05) <= 0.09


def test_items_per_arm_gives_the_power_asked_for():
  """A simulation, not the formula: at items_per_arm(0.6, 0.7) per arm a two-proportion
  z-test rejects 0.6 vs 0.7 in 80% (+-4%) of 4000 simulated pairs; at a quarter of it,
  far less often. Mutation caught: the power's z dropped (`z(power)` as 0: ~50%)."""
  n = intervals.items_per_arm(0.6, 0.7)
  rng = np.random.default_rng(0)

  def power(n):
    x, y = rng.binomial(n, 0.6, 4000) / n, rng.binomial(n, 0.7, 4000) / n
    pooled = (x + y) / 2
    z = np.abs(x - y) / np.sqrt(2 * pooled * (1 - pooled) / n)
    return np.mean(z > 1.959964)

  assert 0.76 <= power(n) <= 0.84 and power(n // 4) < 0.4
  with pytest.raises(ValueError, match="p1=0.5, p2=0.5"):
    intervals.items_per_arm(0.5, 0.5)
