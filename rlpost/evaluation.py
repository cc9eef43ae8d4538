"""GSM8K-style evaluation: greedy answer/format accuracy and pass@k with sampling."""
import dataclasses

import jax
import numpy as np
import tqdm

from rlpost import rollout
from rlpost import sampling
from rlpost.data import prompts as prompts_lib
from rlpost.rewards import gsm8k as gsm8k_rewards


def _completions(params, model_config, tokenizer, problems, template, examples, sc, key, k):
  texts = [prompts_lib.prompt_text(p, template, examples) for p in problems]
  tokens, lengths = sampling.pad_prompts([tokenizer.encode(t) for t in texts], sc)
  out = jax.device_get(sampling.sample(params, tokens, lengths, key, model_config=model_config,
                                       config=sc, num_samples=k))
  batch = rollout.rollout_batch(tokens, lengths, out, k)
  if template != "plain":
    batch = rollout.truncate_at_stop_strings(batch, tokenizer, prompts_lib.STOP_STRINGS)
  prefix = prompts_lib.completion_prefix(template)
  return [prefix + c for c in rollout.completion_texts(batch, tokenizer)]


def accuracy_report(problems, greedy: list[str], samples: list[str], pass_k: int) -> dict:
  """Accuracies of completions already generated (host side, pure).

  Args:
    problems: the `Problem`s, in order.
    greedy: one greedy completion per problem.
    samples: `pass_k` sampled completions per problem, problem-major (empty if pass_k == 0).
    pass_k: samples per problem; pass@k counts a problem solved if ANY sample is correct.
  Returns greedy answer/format accuracy, pass@k and the first three greedy completions.
  """
  if len(greedy) != len(problems) or len(samples) != len(problems) * pass_k:
    raise ValueError(f"{len(problems)} problems need {len(problems)} greedy completions and "
                     f"{len(problems) * pass_k} samples (pass_k={pass_k}); got {len(greedy)} "
                     f"and {len(samples)}")
  report = {
      "num_problems": len(problems),
      "greedy_answer_accuracy": float(np.mean([gsm8k_rewards.is_correct(c, p.final)
                                               for c, p in zip(greedy, problems)])),
      "greedy_format_accuracy": float(np.mean([gsm8k_rewards.has_format(c) for c in greedy])),
      "examples": [{"question": p.question, "truth": p.final, "completion": c}
                   for c, p in zip(greedy[:3], problems)],
  }
  if pass_k:
    hits = np.array([gsm8k_rewards.is_correct(c, p.final)
                     for c, p in zip(samples, [p for p in problems for _ in range(pass_k)])])
    report[f"pass@{pass_k}"] = float(np.mean(hits.reshape(len(problems), pass_k).any(1)))
  return report


def evaluate(params, model_config, tokenizer, problems, *, template: str, examples,
             sampling_config: sampling.SamplingConfig, batch_size: int = 8, pass_k: int = 4,
             temperature: float = 0.8, seed: int = 0, desc: str = "eval") -> dict:
  """Accuracy report over `problems` (see `accuracy_report`).

  Greedy decoding gives `answer_accuracy` (number in the answer tags equals the
  truth) and `format_accuracy` (full reasoning/answer tag format), reported
  separately; `pass_k` samples at `temperature` give pass@k (any of k correct).
  """
  greedy_sc = dataclasses.replace(sampling_config, temperature=0.0)
  sample_sc = dataclasses.replace(sampling_config, temperature=temperature)
  greedy, samples = [], []
  key = jax.random.key(seed)
  for start in tqdm.trange(0, len(problems), batch_size, desc=desc, dynamic_ncols=True):
    chunk = problems[start:start + batch_size]
    greedy += _completions(params, model_config, tokenizer, chunk, template, examples, greedy_sc,
                           key, 1)
    if pass_k:
      samples += _completions(params, model_config, tokenizer, chunk, template, examples,
                              sample_sc, jax.random.fold_in(key, start), pass_k)
  report = {**accuracy_report(problems, greedy, samples, pass_k), "template": template}
  if pass_k:
    report["sampling_temperature"] = temperature
  return report
