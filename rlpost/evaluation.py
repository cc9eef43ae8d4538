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


def evaluate(params, model_config, tokenizer, problems, *, template: str, examples,
             sampling_config: sampling.SamplingConfig, batch_size: int = 8, pass_k: int = 4,
             temperature: float = 0.8, seed: int = 0, desc: str = "eval") -> dict:
  """Accuracy report over `problems`.

  Greedy decoding gives `answer_accuracy` (number in the answer tags equals the
  truth) and `format_accuracy` (full reasoning/answer tag format), reported
  separately; `pass_k` samples at `temperature` give pass@k (any of k correct).
  Returns a dict of metrics plus the first few greedy completions.
  """
  greedy_sc = dataclasses.replace(sampling_config, temperature=0.0)
  sample_sc = dataclasses.replace(sampling_config, temperature=temperature)
  correct, formatted, passed, shown = [], [], [], []
  key = jax.random.key(seed)
  for start in tqdm.trange(0, len(problems), batch_size, desc=desc, dynamic_ncols=True):
    chunk = problems[start:start + batch_size]
    comps = _completions(params, model_config, tokenizer, chunk, template, examples, greedy_sc,
                         key, 1)
    correct += [gsm8k_rewards.is_correct(c, p.final) for c, p in zip(comps, chunk)]
    formatted += [gsm8k_rewards.has_format(c) for c in comps]
    shown += [{"question": p.question, "truth": p.final, "completion": c}
              for c, p in zip(comps, chunk)][:max(0, 3 - len(shown))]
    if pass_k:
      comps = _completions(params, model_config, tokenizer, chunk, template, examples, sample_sc,
                           jax.random.fold_in(key, start), pass_k)
      hits = np.array([gsm8k_rewards.is_correct(c, p.final)
                       for c, p in zip(comps, [p for p in chunk for _ in range(pass_k)])])
      passed += list(hits.reshape(len(chunk), pass_k).any(1))
  report = {"num_problems": len(problems), "template": template,
            "greedy_answer_accuracy": float(np.mean(correct)),
            "greedy_format_accuracy": float(np.mean(formatted)), "examples": shown}
  if pass_k:
    report[f"pass@{pass_k}"] = float(np.mean(passed))
    report["sampling_temperature"] = temperature
  return report
