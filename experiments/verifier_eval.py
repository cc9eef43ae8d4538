r"""A reward model judged as an outcome verifier: correct/incorrect classification of
labelled samples (KTO format, e.g. `experiments.outcome_pairs`' examples.jsonl).

  python -m experiments.verifier_eval --workdir=RM_RUN --fit=train/examples.jsonl \
      --examples=test/examples.jsonl --output=verifier.json

The threshold (predict "correct" when score > threshold) is the one with the highest
accuracy on --fit's samples; the report gives accuracy, the majority-label baseline,
precision, recall and AUROC on both sets (held-out: --examples).
"""

import json
import os

from absl import app
from absl import flags

from experiments import cli
from rlpost import errors
from rlpost.recipes import reward_model
from rlpost.supervised import classifier_metrics

_WORKDIR = flags.DEFINE_string("workdir", "", "The reward-model run (experiments.reward_model).")
_FIT = flags.DEFINE_string("fit", "", "Labelled samples that choose the threshold (JSONL).")
_EXAMPLES = flags.DEFINE_string("examples", "", "Held-out labelled samples (JSONL).")
_SEQ_LEN = flags.DEFINE_integer(
  "seq_len", None, "Tokens per scoring row (default: the run's data.seq_len)."
)
_OUTPUT = cli.define_output("output", "", "Report path (JSON); printed either way.")


def main(argv):
  del argv
  for name, flag in (("--workdir", _WORKDIR), ("--fit", _FIT), ("--examples", _EXAMPLES)):
    if not flag.value:
      raise app.UsageError(f"{name} is required")
  if not os.path.isfile(os.path.join(_WORKDIR.value, "config.json")):
    raise errors.FlagError(
      f"--workdir={_WORKDIR.value!r}: no config.json there: give a reward-model run's "
      "--workdir (experiments.reward_model)"
    )
  fit_scores, fit_labels = reward_model.score_examples(_WORKDIR.value, _FIT.value, _SEQ_LEN.value)
  threshold = classifier_metrics.accuracy_threshold(fit_scores, fit_labels)
  scores, labels = reward_model.score_examples(_WORKDIR.value, _EXAMPLES.value, _SEQ_LEN.value)
  report = {
    "workdir": _WORKDIR.value,
    "fit": {
      "path": _FIT.value,
      **classifier_metrics.classifier_report(fit_scores, fit_labels, threshold),
    },
    "held_out": {
      "path": _EXAMPLES.value,
      **classifier_metrics.classifier_report(scores, labels, threshold),
    },
  }
  text = json.dumps(report, indent=1)
  print(text)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w", encoding="utf-8") as f:
      f.write(text)


if __name__ == "__main__":
  cli.run(main)
