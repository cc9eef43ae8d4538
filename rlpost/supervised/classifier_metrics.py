"""A scorer judged as a correct/incorrect classifier (host NumPy): e.g. a reward model
used as an outcome verifier on labelled samples.

Scores are float [N], labels bool [N] (True: correct). The decision threshold is chosen
on one set of labelled scores (`accuracy_threshold`) and applied to another
(`classifier_report`), so held-out accuracy is not fitted to the held-out labels.
"""

import numpy as np


def auroc(scores_N: np.ndarray, labels_N: np.ndarray) -> float:
  """The probability that a random positive outscores a random negative (ties count
  half): the area under the ROC curve, from ranks (Mann-Whitney U). NaN without both
  classes."""
  scores, labels = np.asarray(scores_N, np.float64), np.asarray(labels_N, bool)
  pos, neg = int(labels.sum()), int((~labels).sum())
  if pos == 0 or neg == 0:
    return float("nan")
  order = np.argsort(scores, kind="stable")
  ranks = np.empty(len(scores), np.float64)
  sorted_scores = scores[order]
  first = np.searchsorted(sorted_scores, sorted_scores, side="left")
  last = np.searchsorted(sorted_scores, sorted_scores, side="right")
  ranks[order] = (first + last + 1) / 2.0  # 1-based ranks, ties at their mean
  u = ranks[labels].sum() - pos * (pos + 1) / 2.0
  return float(u / (pos * neg))


def accuracy_threshold(scores_N: np.ndarray, labels_N: np.ndarray) -> float:
  """The threshold t (predict correct when score > t) with the highest accuracy on these
  labelled scores: a midpoint between neighbouring distinct scores, or below / above
  them all; the lowest such t on ties."""
  scores, labels = np.asarray(scores_N, np.float64), np.asarray(labels_N, bool)
  if len(scores) == 0:
    raise ValueError("accuracy_threshold needs at least one labelled score")
  distinct = np.unique(scores)
  candidates = np.concatenate(
    [[distinct[0] - 1.0], (distinct[:-1] + distinct[1:]) / 2.0, [distinct[-1] + 1.0]]
  )
  correct = [np.sum((scores > t) == labels) for t in candidates]
  return float(candidates[int(np.argmax(correct))])


def classifier_report(scores_N: np.ndarray, labels_N: np.ndarray, threshold: float) -> dict:
  """{"num_examples", "positive_rate", "accuracy", "majority_accuracy", "precision",
  "recall", "auroc", "threshold"} of predicting correct when score > threshold.
  `majority_accuracy` is the accuracy of always answering the more common label: the
  baseline the accuracy must beat. Precision is NaN when nothing is predicted correct."""
  scores, labels = np.asarray(scores_N, np.float64), np.asarray(labels_N, bool)
  predicted = scores > threshold
  true_pos = int(np.sum(predicted & labels))
  positive_rate = float(labels.mean())
  return {
    "num_examples": int(len(labels)),
    "positive_rate": positive_rate,
    "accuracy": float(np.mean(predicted == labels)),
    "majority_accuracy": max(positive_rate, 1.0 - positive_rate),
    "precision": true_pos / int(predicted.sum()) if predicted.any() else float("nan"),
    "recall": true_pos / int(labels.sum()) if labels.any() else float("nan"),
    "auroc": auroc(scores, labels),
    "threshold": float(threshold),
  }
