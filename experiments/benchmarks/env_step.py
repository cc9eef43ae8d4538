r"""An environment step's cost against one turn's sampling, per adapter (issue 67's goal:
under 10% on the tiny model).

For each environment (`ADAPTERS`: reasoning-gym, gymnasium's toy-text games, textarena
games, and the library's own FrozenLake beside gymnasium's), episodes are played on the
host with replies cycled from a fixed list, a reset whenever one ends, and each
`env.step` and `env.reset` timed. One turn's sampling is a sampler call on the model
(`--preset`, random weights): `--rows` rows of a `--prompt_len`-token prompt sampling
`--turn_tokens` tokens, timed after its compilation. A turn steps every row's
environment on the host, so the ratio is rows x step median / turn sampling median
(the steps run on a thread pool, but Python code holds the GIL: sequential is the bound).

Prints ONE JSON object: the machine, the load, `turn_sampling_s` and per adapter
step_ms (median, p90), reset_ms (median), episode_ms (reset + steps to the end or
`--max_turns`, median), first observation's characters, and `step_vs_turn` (goal < 0.1).

  python -m experiments.benchmarks.env_step [--preset=tiny --rows=8 --steps=300]
"""

import json
import os
import platform
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from rlpost import sampling
from rlpost.envs import protocol
from rlpost.envs import table as env_table
from rlpost.models import decoder, families

_PRESET = flags.DEFINE_string("preset", "tiny", "Model preset of the sampling turn.")
_ROWS = flags.DEFINE_integer("rows", 8, "Rows sampled per turn (environments stepped per turn).")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens of the sampling turn.")
_TURN = flags.DEFINE_integer("turn_tokens", 16, "Tokens sampled per turn.")
_STEPS = flags.DEFINE_integer("steps", 300, "Timed environment steps per adapter.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 8, "Turns of an episode before a reset.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed sampling turns.")

MOVES = ("left", "down", "right", "up")
# label -> (env block, replies cycled through)
ADAPTERS = {
  "reasoning_gym/chain_sum": (
    {"name": "reasoning_gym", "task": "chain_sum"},
    ("<answer>5</answer>",),
  ),
  "reasoning_gym/basic_arithmetic,retries=2": (
    {"name": "reasoning_gym", "task": "basic_arithmetic", "retries": 2},
    ("<answer>7</answer>", "no answer"),
  ),
  "frozenlake (ours, word style)": ({"name": "frozenlake", "size": 4}, MOVES),
  "frozenlake (ours, slippery)": ({"name": "frozenlake", "size": 4, "slippery": True}, MOVES),
  "gymnasium/FrozenLake-v1": (
    {"name": "gymnasium", "id": "FrozenLake-v1", "kwargs": '{"is_slippery": false}'},
    MOVES,
  ),
  "gymnasium/FrozenLake-v1 slippery": ({"name": "gymnasium", "id": "FrozenLake-v1"}, MOVES),
  "gymnasium/FrozenLake random 8x8": (
    {"name": "gymnasium", "id": "FrozenLake-v1", "random_map_size": 8},
    MOVES,
  ),
  "gymnasium/Taxi-v4": (
    {"name": "gymnasium", "id": "Taxi-v4"},
    ("south", "north", "east", "west", "pickup", "dropoff"),
  ),
  "gymnasium/CliffWalking-v1": ({"name": "gymnasium", "id": "CliffWalking-v1"}, ("up", "right")),
  "gymnasium/Blackjack-v1": ({"name": "gymnasium", "id": "Blackjack-v1"}, ("hit", "stick")),
  "textarena/GuessTheNumber-v0": (
    {"name": "textarena", "game": "GuessTheNumber-v0"},
    ("[10]", "[5]", "[15]"),
  ),
  "textarena/TowerOfHanoi-v0": (
    {"name": "textarena", "game": "TowerOfHanoi-v0"},
    ("[A C]", "[A B]", "[C B]"),
  ),
  "textarena/Sudoku-v0": ({"name": "textarena", "game": "Sudoku-v0"}, ("[1 1 5]", "[2 3 4]")),
  "textarena/TicTacToe-v0 (vs random)": (
    {"name": "textarena", "game": "TicTacToe-v0"},
    ("[4]", "[0]", "[8]", "[2]"),
  ),
  "textarena/ConnectFour-v0 (vs random)": (
    {"name": "textarena", "game": "ConnectFour-v0"},
    ("[col 3]", "[col 2]", "[col 4]"),
  ),
}


def _ms(values, q=50) -> float:
  return round(1000 * float(np.percentile(values, q)), 4)


def time_adapter(block: dict, replies, steps: int, max_turns: int) -> dict:
  """Step, reset and episode timings of one environment (module docstring)."""
  config = env_table.env_config(block)
  tasks = env_table.make(block["name"], config, protocol.RunInfo(eval_tasks=1), False)
  env = tasks.env
  step_s, reset_s, episode_s = [], [], []
  seed, turn, first_chars = 0, 0, None
  start = time.perf_counter()
  state, text = env.reset(tasks.train_tasks([0])[0], 0)
  reset_s.append(time.perf_counter() - start)
  first_chars, episode_start = len(text), start
  for k in range(steps):
    t = time.perf_counter()
    out = env.step(state, replies[k % len(replies)])
    step_s.append(time.perf_counter() - t)
    state, turn = out.state, turn + 1
    if out.done or turn >= max_turns:
      episode_s.append(time.perf_counter() - episode_start)
      seed, turn = seed + 1, 0
      pool = tasks.pool or 10**6
      t = time.perf_counter()
      state, _ = env.reset(tasks.train_tasks([seed % pool])[0], seed % pool)
      reset_s.append(time.perf_counter() - t)
      episode_start = t
  return {
    "step_ms": _ms(step_s),
    "step_ms_p90": _ms(step_s, 90),
    "reset_ms": _ms(reset_s),
    "episode_ms": _ms(episode_s) if episode_s else None,
    "episodes": len(episode_s),
    "first_observation_chars": first_chars,
    "step_s_median": float(np.median(step_s)),
  }


def turn_sampling_s(preset: str, rows: int, prompt_len: int, new_tokens: int, repeats: int):
  """Median seconds of one sampler call (rows x new_tokens after a prompt), compiled."""
  config = families.get_config(preset)
  params = decoder.init_params(jax.random.key(0), config, jnp.float32)
  sc = sampling.SamplingConfig(
    temperature=1.0, max_new_tokens=new_tokens, stop_ids=(), prompt_bucket=prompt_len
  )
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(3, config.vocab_size, (rows, prompt_len)), jnp.int32
  )
  lengths = jnp.full((rows,), prompt_len, jnp.int32)
  run = lambda k: sampling.sample(
    params, tokens, lengths, jax.random.key(k), model_config=config, config=sc
  )
  jax.block_until_ready(run(0))
  times = []
  for k in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run(k + 1))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(argv):
  del argv
  load_before = open("/proc/loadavg").read().split()[:3]
  turn = turn_sampling_s(_PRESET.value, _ROWS.value, _PROMPT.value, _TURN.value, _REPEATS.value)
  adapters = {}
  for label, (block, replies) in ADAPTERS.items():
    result = time_adapter(block, replies, _STEPS.value, _MAX_TURNS.value)
    result["step_vs_turn"] = round(_ROWS.value * result.pop("step_s_median") / turn, 5)
    adapters[label] = result
  print(
    json.dumps(
      {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "preset": _PRESET.value,
        "rows": _ROWS.value,
        "prompt_len": _PROMPT.value,
        "turn_tokens": _TURN.value,
        "turn_sampling_s": round(turn, 5),
        "adapters": adapters,
        "worst_step_vs_turn": max(a["step_vs_turn"] for a in adapters.values()),
      },
      indent=1,
    )
  )


if __name__ == "__main__":
  app.run(main)
