"""Outcome-supervision records from a model's own GSM8K solutions.

From `k` sampled solutions per problem, checked by the answer reward
(`rewards.gsm8k.is_correct`):

- **pairs** (DPO's JSONL format, for DPO / ORPO / SimPO and a Bradley-Terry verifier,
  `experiments.reward_model`): one per wrong sample, chosen = a correct sample of the
  same problem (taken in turn) or, when the model solved none, the reference solution in
  the answer format (`gsm8k.sft_completion`); rejected = the wrong sample;
- **examples** (KTO's JSONL format): every sample with its label, correct or not; the
  held-out ones measure a verifier as a correct/incorrect classifier.

Records carry the GSM8K system text and the question as the user turn: the layout of the
RL recipes' `data.template=chat` prompts, so a verifier trained on them scores rollouts
laid out as it was trained.
"""

from collections.abc import Sequence

from rlpost.data.gsm8k import SYSTEM_PROMPT, Problem, sft_completion
from rlpost.rewards import gsm8k as gsm8k_rewards


def records(
  problems: Sequence[Problem], samples: Sequence[str], k: int
) -> tuple[list[dict], list[dict]]:
  """(pairs, examples) of `k` samples per problem, problem-major.

  pairs: {"system", "prompt", "chosen", "rejected", "chosen_source": "sample" |
  "reference", "problem": its index}; examples: {"system", "prompt", "completion",
  "label": bool, "problem"}.
  """
  if k < 1 or len(samples) != len(problems) * k:
    raise ValueError(
      f"{len(problems)} problems x k={k} samples need {len(problems) * k}, got {len(samples)}"
    )
  pairs, examples = [], []
  for i, problem in enumerate(problems):
    mine = list(samples[i * k : (i + 1) * k])
    right = [gsm8k_rewards.is_correct(s, problem.final) for s in mine]
    head = {"system": SYSTEM_PROMPT, "prompt": problem.question}
    examples += [{**head, "completion": s, "label": ok, "problem": i} for s, ok in zip(mine, right)]
    correct = [s for s, ok in zip(mine, right) if ok]
    wrong = [s for s, ok in zip(mine, right) if not ok]
    for j, rejected in enumerate(wrong):
      source = "sample" if correct else "reference"
      chosen = correct[j % len(correct)] if correct else sft_completion(problem)
      pairs.append(
        {**head, "chosen": chosen, "rejected": rejected, "chosen_source": source, "problem": i}
      )
  return pairs, examples
