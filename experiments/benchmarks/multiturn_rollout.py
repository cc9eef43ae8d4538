r"""Multi-turn rollout throughput against the single-turn sampler (Gemma 3 270M architecture).

Workload (flags): B rows, a P-token prompt, K turns of S sampled tokens, each turn
but the last followed by an O-token observation; random weights and no stop ids,
so every turn samples exactly S tokens. The single-turn reference samples the
same K * S tokens per row from the same prompt in one call. Both are run once to
compile, then timed in `--repeats` rounds of one of each (steady state). Prints ONE JSON object:

  multiturn    seconds (min, median), sampled tokens/s, sampler calls
  single_turn  seconds (min, median), sampled tokens/s
  cost_ratio   multiturn median / single-turn median seconds (issue 35's targets:
               <= 1.15x at 4 turns, <= 1.3x at 8)
  cost_ratio_of_pairs  the median of multiturn / single-turn over the rounds (each
               round times one of each, back to back)
  train_step   the GRPO update (reference pass + one LoRA train step, the
               frozenlake_gemma3 settings) on each rollout's batch: seconds
               (min, median), seconds per sampled (loss) token and per
               trajectory token (sampled + observation), and the multi-turn /
               single-turn ratio per sampled token (`--train_repeats=0`: skipped)

  python -m experiments.benchmarks.multiturn_rollout
"""

import dataclasses
import json
import os
import statistics
import time

from absl import app
from absl import flags

from experiments.benchmarks import machine
import jax
import jax.numpy as jnp

from experiments.configs import agentic as agentic_configs
from rlpost import sampling
from rlpost.envs import multiturn
from rlpost.envs import protocol
from rlpost.models import decoder, families
from rlpost.text import tokenizer as tokenizer_lib
from rlpost.recipes import rl
from rlpost.rl import batch as batch_lib
from rlpost.rl import grpo_update as grpo_lib

_PRESET = flags.DEFINE_string("preset", "gemma3_270m", "Model preset.")
_ROWS = flags.DEFINE_integer("rows", 8, "Episodes (rows).")
_PROMPT = flags.DEFINE_integer("prompt_len", 32, "First prompt tokens.")
_TURNS = flags.DEFINE_integer("turns", 4, "Model turns per episode.")
_SAMPLED = flags.DEFINE_integer("sampled", 16, "Sampled tokens per turn.")
_OBSERVED = flags.DEFINE_integer("observed", 16, "Observation tokens after each turn.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions.")
_TRAIN_REPEATS = flags.DEFINE_integer("train_repeats", 3, "Timed GRPO updates per batch (0: none).")


def _fixed_env(turns: int, prompt_len: int, observed: int) -> protocol.Env:
  """Episodes of exactly `turns` turns; observations of `observed` byte tokens
  (the plain scaffold adds one "\\n" token, so the text has observed - 1 bytes)."""

  def reset(task, seed):
    return 0, "p" * (prompt_len - 1)  # BOS + prompt_len - 1 bytes

  def step(turn, text):
    done = turn + 1 >= turns
    return protocol.Step(turn + 1, "" if done else "o" * (observed - 1), 0.0, done, {})

  return protocol.Env("fixed", reset, step, max_turns=turns)


def main(argv):
  del argv
  config = families.get_config(_PRESET.value)
  params = decoder.init_params(jax.random.key(0), config)
  tok = tokenizer_lib.byte_tokenizer()
  B, K, S, O, P = _ROWS.value, _TURNS.value, _SAMPLED.value, _OBSERVED.value, _PROMPT.value
  sc = sampling.SamplingConfig(
    temperature=1.0, stop_ids=(), max_new_tokens=S, pad_id=tok.pad_id, prompt_bucket=16
  )
  turns = multiturn.TurnConfig("plain", S, K * S + (K - 1) * O)
  env = _fixed_env(K, P, O)
  calls = []

  def multi():
    out = multiturn.rollout(
      params,
      env,
      [None] * B,
      list(range(B)),
      jax.random.key(1),
      tokenizer=tok,
      model_config=config,
      sampling_config=sc,
      turns=turns,
    )
    calls.append(len(out.episodes[0].texts))
    return out.batch

  single_sc = sampling.SamplingConfig(
    temperature=1.0, stop_ids=(), max_new_tokens=K * S, pad_id=tok.pad_id, prompt_bucket=16
  )
  prompt = jnp.full((B, P), 5, jnp.int32)
  lengths = jnp.full((B,), P, jnp.int32)

  def single():
    out = sampling.sample(
      params, prompt, lengths, jax.random.key(1), model_config=config, config=single_sc
    )
    return batch_lib.from_samples(prompt, lengths, jax.device_get(out), 1)

  report = {
    "workload": {
      "preset": _PRESET.value,
      "rows": B,
      "prompt_len": P,
      "turns": K,
      "sampled_per_turn": S,
      "observed_per_turn": O,
    },
    "cpu": machine.cpu_model(),
    "jax": jax.__version__,
    "load_average_before": os.getloadavg(),
  }
  fns = {"multiturn": multi, "single_turn": single}
  times, batches = _interleaved(fns, _REPEATS.value)
  for name in fns:
    median = statistics.median(times[name])
    report[name] = {
      "seconds_min": min(times[name]),
      "seconds_median": median,
      "sampled_tokens_per_s": B * K * S / median,
    }
  assert all(c == K for c in calls), calls  # every episode took its K turns
  report["multiturn"]["sampler_calls"] = K
  report["cost_ratio"] = (
    report["multiturn"]["seconds_median"] / report["single_turn"]["seconds_median"]
  )
  report["cost_ratio_of_pairs"] = statistics.median(
    m / s for m, s in zip(times["multiturn"], times["single_turn"])
  )
  if _TRAIN_REPEATS.value:
    report["train_step"] = _train_steps(config, params, tok, batches, _TRAIN_REPEATS.value)
  report["load_average_after"] = os.getloadavg()
  print(json.dumps(report, indent=2))


def _interleaved(fns: dict, repeats: int):
  """Each function once to compile, then `repeats` rounds timing each once in turn (a
  slow spell of the machine hits both alike). Returns ({name: seconds}, {name: last
  result})."""
  results = {name: jax.block_until_ready(fn()) for name, fn in fns.items()}
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      results[name] = jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return times, results


def _timed(fn, repeats: int):
  """(seconds of `repeats` timed calls after one compiling call, the last result)."""
  result = jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times, result


def _train_steps(config, params, tok, batches: dict, repeats: int) -> dict:
  """The GRPO learner's update on each batch (random rewards: random group advantages);
  the state is donated, so each update continues from the previous one's (same shapes,
  same cost)."""
  cfg = agentic_configs.get_config("frozenlake_gemma3")
  with cfg.unlocked():
    cfg.model.weights = "random"
    cfg.model.preset = _PRESET.value
    cfg.train.micro_batch_size = _ROWS.value
    cfg.train.batch_tasks, cfg.algo.num_generations = 1, _ROWS.value  # one group: the batch
  p = rl.build(cfg, loaded=(config, params, tok))
  report, state = {}, [p.state]

  def update(batch):
    state[0], metrics = grpo_lib.grpo_update(p.learner, state[0], batch, 0)
    return metrics

  for name, batch in batches.items():
    batch = batch_lib.to_device(batch)
    rows = batch.loss_mask.shape[0]
    batch = dataclasses.replace(
      batch, scores=jax.random.normal(jax.random.key(2), (rows,)), turn_ids=None
    )
    times, _ = _timed(lambda: update(batch), repeats)
    median = statistics.median(times)
    sampled = float(batch.loss_mask.sum())
    trajectory = float(batch.valid[:, batch.prompt_len :].sum())
    report[name] = {
      "seconds_min": min(times),
      "seconds_median": median,
      "sampled_tokens": sampled,
      "trajectory_tokens": trajectory,
      "seconds_per_sampled_token": median / sampled,
      "seconds_per_trajectory_token": median / trajectory,
    }
  report["ratio_per_sampled_token"] = (
    report["multiturn"]["seconds_per_sampled_token"]
    / report["single_turn"]["seconds_per_sampled_token"]
  )
  return report


if __name__ == "__main__":
  app.run(main)
