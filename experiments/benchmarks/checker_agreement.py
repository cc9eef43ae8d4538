r"""The library's GSM8K answer check against math-verify on GSM8K's test answers.

Each test problem's final answer n (after "####") is written in several ways (`VARIANTS`:
"$1000", "1,000", "1000.00", "\boxed{1000}", a sentence, n + 1 as a wrong answer, ...),
once as the prediction against the gold as GSM8K writes it, once as the gold against the
plain prediction "n". Ours is `rlpost.rewards.gsm8k.is_correct` on "<answer>v</answer>"
(what GSM8K's answer_accuracy and check_numbers read); math-verify is
`rlpost.rewards.checkers.math_verify` (its parse and verify in a bounded worker process).

Prints ONE JSON object: per variant and side, the share each checker accepts and the
disagreements' count, with up to `--examples` examples each.

  python -m experiments.benchmarks.checker_agreement --data_dir=../shared/data/gsm8k
"""

import json
import os

from absl import app
from absl import flags

from rlpost.rewards import checkers
from rlpost.rewards import gsm8k as gsm8k_rewards

_DATA = flags.DEFINE_string("data_dir", "../shared/data/gsm8k", "GSM8K's jsonl directory.")
_EXAMPLES = flags.DEFINE_integer("examples", 3, "Disagreement examples per variant.")

VARIANTS = {
  "plain": lambda n: str(n),
  "thousands_commas": lambda n: f"{n:,}",
  "dollar": lambda n: f"${n}",
  "dollar_commas": lambda n: f"${n:,}",
  "decimal": lambda n: f"{n}.00",
  "boxed": lambda n: f"\\boxed{{{n}}}",
  "latex_inline": lambda n: f"${n}$",
  "sentence": lambda n: f"The answer is {n}.",
  "units": lambda n: f"{n} dollars",
  "fraction": lambda n: f"\\frac{{{2 * n}}}{{2}}",
  "percent": lambda n: f"{n}%",
  "spaced_thousands": lambda n: f"{n:,}".replace(",", " "),
  "working_then_result": lambda n: f"{n + 1} - 1 = {n}",
  "two_candidates": lambda n: f"{n} or {n + 1}",
  "wrong_by_one": lambda n: str(n + 1),
}
WRONG = ("wrong_by_one", "two_candidates", "working_then_result")  # not written as golds


def finals(path: str) -> list[str]:
  """GSM8K's final answers as written after '####'."""
  with open(path) as f:
    return [json.loads(line)["answer"].split("####")[-1].strip() for line in f]


def compare(pairs) -> dict:
  """Acceptance shares and disagreements over (prediction, gold) pairs."""
  ours = [gsm8k_rewards.is_correct(f"<answer>{p}</answer>", g) for p, g in pairs]
  theirs = [checkers.math_verify(p, g) for p, g in pairs]
  differ = [
    {"prediction": p, "gold": g, "ours": o, "math_verify": t}
    for (p, g), o, t in zip(pairs, ours, theirs)
    if o != t
  ]
  return {
    "ours_accepts": round(sum(ours) / len(pairs), 4),
    "math_verify_accepts": round(sum(theirs) / len(pairs), 4),
    "disagree": len(differ),
    "examples": differ[: _EXAMPLES.value],
  }


def main(argv):
  del argv
  golds = finals(os.path.join(_DATA.value, "test.jsonl"))
  numbers = [int(g.replace(",", "")) for g in golds]
  out = {"problems": len(golds), "as_prediction": {}, "as_gold": {}}
  for name, write in VARIANTS.items():
    out["as_prediction"][name] = compare([(write(n), g) for n, g in zip(numbers, golds)])
    if name not in WRONG:
      out["as_gold"][name] = compare([(str(n), write(n)) for n in numbers])
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
