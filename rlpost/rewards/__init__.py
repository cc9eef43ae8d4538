"""Reward functions and the policy for scoring a batch with several of them.

A reward function is a plain function `(prompts, completions, answers) ->
list[float]`, one value per completion. `score` sums several of them.

Error policy (documented, tested): a reward function that raises on a batch
is retried example by example; examples on which it still raises get reward
0.0 and are counted in the metric `reward/<name>/errors`. If more than
`max_error_fraction` of the batch fails, `score` raises RuntimeError naming the
function and the first failing example, chained to the original exception:
a broken reward function stops training loudly instead of silently feeding
zeros to the policy. Non-finite values and wrong lengths are errors too.
"""

import importlib
import math
from typing import Callable, Sequence

import numpy as np

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float]]


def _checked(fn: RewardFn, prompts, completions, answers) -> list[float]:
  values = list(fn(prompts, completions, answers))
  if len(values) != len(completions):
    raise ValueError(f"returned {len(values)} rewards for {len(completions)} completions")
  values = [float(v) for v in values]
  bad = [v for v in values if not math.isfinite(v)]
  if bad:
    raise ValueError(f"returned non-finite rewards {bad[:3]}")
  return values


def _score_one(fn: RewardFn, name: str, prompts, completions, answers, max_error_fraction):
  try:
    return _checked(fn, prompts, completions, answers), 0
  except Exception:  # pylint: disable=broad-except
    pass
  values, errors, first = [], 0, None
  for i, (p, c, a) in enumerate(zip(prompts, completions, answers)):
    try:
      values.extend(_checked(fn, [p], [c], [a]))
    except Exception as e:  # pylint: disable=broad-except
      values.append(0.0)
      errors += 1
      first = first or (i, c, e)
  if errors > max_error_fraction * len(completions):
    i, c, e = first
    raise RuntimeError(
      f"reward function {name!r} failed on {errors}/{len(completions)} "
      f"completions (first: example {i}, completion {c[:200]!r}): {e!r}"
    ) from e
  return values, errors


def score(
  reward_fns: dict[str, RewardFn],
  prompts: Sequence[str],
  completions: Sequence[str],
  answers: Sequence[str],
  max_error_fraction: float = 0.5,
):
  """Scores completions with every function of `reward_fns` (name -> fn).

  Returns (per_fn: name -> [N] float32, errors: name -> count of failed examples).
  The total reward is the sum over functions.
  """
  per_fn, errors = {}, {}
  for name, fn in reward_fns.items():
    values, errors[name] = _score_one(fn, name, prompts, completions, answers, max_error_fraction)
    per_fn[name] = np.asarray(values, np.float32)
  return per_fn, errors


def load_reward_fns(spec: str) -> dict[str, RewardFn]:
  """The reward functions named by `spec`: comma-separated `MODULE:FUNCTION` references
  (e.g. "rlpost.rewards.digit:digit_count,mypkg.rewards:length"), each imported and
  keyed by its FUNCTION name (metrics `reward/<name>`), in the order given.

  ValueError names the reference that does not resolve and how to write one.
  """
  example = "e.g. 'rlpost.rewards.digit:digit_count' (several: comma-separated)"
  refs = [ref.strip() for ref in spec.split(",")]
  if not spec.strip() or not all(refs):
    raise ValueError(f"name at least one reward function as MODULE:FUNCTION, {example}")
  fns = {}
  for ref in refs:
    module_name, colon, name = ref.partition(":")
    if not (colon and module_name and name.isidentifier()):
      raise ValueError(f"{ref!r} is not MODULE:FUNCTION; write {example}")
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      raise ValueError(
        f"{ref!r}: module {module_name!r} does not import ({e}); put it on PYTHONPATH"
      ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
      raise ValueError(
        f"{ref!r}: {module_name} has no function {name!r}; a reward function is "
        "(prompts, completions, answers) -> list[float]"
      )
    if name in fns:
      raise ValueError(f"{ref!r}: a second reward function named {name!r} (metrics key on it)")
    fns[name] = fn
  return fns
