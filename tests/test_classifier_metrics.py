"""A scorer judged as a classifier: AUROC, the accuracy threshold and the report against
slow obvious references (every positive/negative pair; every threshold tried)."""

import itertools

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from rlpost.supervised import classifier_metrics as cm

# Scores drawn from a few values so that ties are common.
SCORED = st.lists(
  st.tuples(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]), st.booleans()),
  min_size=1,
  max_size=12,
)


def _split(pairs):
  return np.array([s for s, _ in pairs]), np.array([l for _, l in pairs], bool)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(SCORED)
def test_auroc_is_the_share_of_positive_negative_pairs_ranked_right(pairs):
  """AUROC from ranks equals the count over every (positive, negative) pair of
  [positive > negative] + 0.5 [tie], divided by the number of pairs; NaN without both
  classes. Mutation caught: ties ranked by position instead of at their mean rank."""
  scores, labels = _split(pairs)
  pos, neg = scores[labels], scores[~labels]
  got = cm.auroc(scores, labels)
  if len(pos) == 0 or len(neg) == 0:
    assert np.isnan(got)
    return
  wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg))
  np.testing.assert_allclose(got, wins / (len(pos) * len(neg)), rtol=1e-12)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(SCORED)
def test_the_threshold_has_the_best_accuracy_of_all_thresholds(pairs):
  """`accuracy_threshold`'s accuracy (score > t predicts True) equals the best accuracy
  over thresholds at, between, below and above every score. Mutation caught: the
  comparison's direction flipped (predicting True below the threshold)."""
  scores, labels = _split(pairs)
  t = cm.accuracy_threshold(scores, labels)
  grid = np.concatenate([scores, scores - 1e-3, scores + 1e-3])
  best = max(np.mean((scores > g) == labels) for g in grid)
  assert np.mean((scores > t) == labels) == best
  assert cm.classifier_report(scores, labels, t)["accuracy"] == best


def test_report_on_a_hand_worked_case():
  """Scores [0.9, 0.8, 0.3, 0.1, 0.7] with labels [T, F, T, F, F] at threshold 0.5:
  predictions [T, T, F, F, T]: accuracy 2/5, precision 1/3, recall 1/2, majority
  baseline 3/5, AUROC (pairs 0.9 beats all 3 negatives, 0.3 beats one) 4/6."""
  report = cm.classifier_report(
    np.array([0.9, 0.8, 0.3, 0.1, 0.7]), np.array([1, 0, 1, 0, 0], bool), 0.5
  )
  assert report["num_examples"] == 5 and report["threshold"] == 0.5
  for key, want in {
    "accuracy": 2 / 5,
    "precision": 1 / 3,
    "recall": 1 / 2,
    "majority_accuracy": 3 / 5,
    "positive_rate": 2 / 5,
    "auroc": 4 / 6,
  }.items():
    assert report[key] == pytest.approx(want), key


def test_no_labelled_scores_is_an_error():
  with pytest.raises(ValueError, match="at least one labelled score"):
    cm.accuracy_threshold(np.array([]), np.array([], bool))
