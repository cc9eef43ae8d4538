r"""Multi-turn rollout throughput against the single-turn sampler (Gemma 3 270M architecture).

Workload (flags): B rows, a P-token prompt, K turns of S sampled tokens, each turn
but the last followed by an O-token observation; random weights and no stop ids,
so every turn samples exactly S tokens. The single-turn reference samples the
same K * S tokens per row from the same prompt in one call. Both are run once to
compile, then timed `--repeats` times (steady state). Prints ONE JSON object:

  multiturn    seconds (min, median), sampled tokens/s, sampler calls
  single_turn  seconds (min, median), sampled tokens/s
  cost_ratio   multiturn median / single-turn median seconds (the issue's target:
               <= 2x with re-prefill)

  python -m experiments.benchmarks.multiturn_rollout
"""

import json
import platform
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from rlpost import sampling
from rlpost.envs import multiturn
from rlpost.envs import protocol
from rlpost.models import gemma3
from rlpost.models import tokenizer as tokenizer_lib

_PRESET = flags.DEFINE_string("preset", "gemma3_270m", "Model preset.")
_ROWS = flags.DEFINE_integer("rows", 8, "Episodes (rows).")
_PROMPT = flags.DEFINE_integer("prompt_len", 32, "First prompt tokens.")
_TURNS = flags.DEFINE_integer("turns", 4, "Model turns per episode.")
_SAMPLED = flags.DEFINE_integer("sampled", 16, "Sampled tokens per turn.")
_OBSERVED = flags.DEFINE_integer("observed", 16, "Observation tokens after each turn.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions.")


def _fixed_env(turns: int, prompt_len: int, observed: int) -> protocol.Env:
  """Episodes of exactly `turns` turns; observations of `observed` byte tokens
  (the plain scaffold adds one "\\n" token, so the text has observed - 1 bytes)."""

  def reset(task, seed):
    return 0, "p" * (prompt_len - 1)  # BOS + prompt_len - 1 bytes

  def step(turn, text):
    done = turn + 1 >= turns
    return protocol.Step(turn + 1, "" if done else "o" * (observed - 1), 0.0, done, {})

  return protocol.Env("fixed", reset, step, max_turns=turns)


def _cpu_model() -> str:
  """The CPU model name (what `lscpu` prints), or the platform's machine type."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.machine()


def main(argv):
  del argv
  config = gemma3.get_config(_PRESET.value)
  params = gemma3.init_params(jax.random.key(0), config)
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
    return out.batch.tokens

  single_sc = sampling.SamplingConfig(
    temperature=1.0, stop_ids=(), max_new_tokens=K * S, pad_id=tok.pad_id, prompt_bucket=16
  )
  prompt = jnp.full((B, P), 5, jnp.int32)
  lengths = jnp.full((B,), P, jnp.int32)

  def single():
    return sampling.sample(
      params, prompt, lengths, jax.random.key(1), model_config=config, config=single_sc
    ).tokens

  report = {
    "workload": {
      "preset": _PRESET.value,
      "rows": B,
      "prompt_len": P,
      "turns": K,
      "sampled_per_turn": S,
      "observed_per_turn": O,
    },
    "cpu": _cpu_model(),
    "jax": jax.__version__,
  }
  for name, fn in (("multiturn", multi), ("single_turn", single)):
    jax.block_until_ready(fn())
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times.append(time.perf_counter() - start)
    median = statistics.median(times)
    report[name] = {
      "seconds_min": min(times),
      "seconds_median": median,
      "sampled_tokens_per_s": B * K * S / median,
    }
  assert all(c == K for c in calls), calls  # every episode took its K turns
  report["multiturn"]["sampler_calls"] = K
  report["cost_ratio"] = (
    report["multiturn"]["seconds_median"] / report["single_turn"]["seconds_median"]
  )
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  app.run(main)
