"""The environment protocol: host-side plain functions over immutable state.

An environment is an `Env` of functions, never an object with hidden state:

  reset(task, seed) -> (state, observation_text)
  step(state, assistant_text) -> Step(state, observation_text, reward, done, info)

`task` is what the environment is about (a map, a math problem; None lets the
environment derive it from `seed`), `seed` makes everything random about it
reproducible: the same (task, seed) and the same assistant texts give the same
observations and rewards. `step` must not mutate its input state (return a new
one), so a driver can keep, retry or compare states freely.

What the driver (`rlpost.envs.multiturn.rollout`) assumes and checks:
  - `step` runs on a thread pool (the agentic recipe's `rollout_threads`, 8 by default):
    the alive rows of a turn are stepped concurrently, so `step` and every tool it calls
    must be thread-safe. Pure functions over immutable state are; a shared client,
    subprocess or cache needs a lock, or `rollout_threads=1`.
  - The G episodes of a task all start from the one state object `reset` returned:
    another reason `step` must not mutate its input.
  - There is no timeout: a `step` (or tool) that blocks blocks the rollout, and a Python
    thread cannot be stopped from outside. Bound your own I/O (timeouts on network calls
    and subprocesses) and answer a timed-out call with an observation (a tool: an
    "error: ..." result).
  - A reset or step that raises, or returns something else than documented (a reward
    that is not a number finite in float32, an observation that is not UTF-8-encodable
    text, ...), stops the rollout with an error naming the environment, the seed and the
    turn. Tools are contained instead (`rlpost.envs.tools`): a failing tool is an
    "error: ..." result the model sees.

`info` keys the metrics read when present (all bools):
  success         the episode reached its goal (e.g. FrozenLake's G)
  invalid_action  the assistant text could not be parsed as an action
  tool_call       the turn was a tool call (answered by a tool, not the env)
  tool_error      the tool call failed (unknown tool, bad arguments, ...)
"""

import numbers
from typing import Any, Callable, Hashable, NamedTuple

INFO_FLAGS = ("success", "invalid_action", "tool_call", "tool_error")  # bools, when present


class Step(NamedTuple):
  """What `Env.step` returns."""

  state: Any
  observation: str  # text shown to the model next ("" when done)
  reward: float
  done: bool
  info: dict


class Env(NamedTuple):
  """An environment: its functions and the limits a rollout driver applies.

  name: label for metrics and configs.
  reset: (task, seed) -> (state, first observation text).
  step: (state, assistant_text) -> Step.
  max_turns: model turns per episode; the driver ends (truncates) an episode
    that is not done after this many turns.
  stop_strings: texts that end a model turn besides the end-of-turn token
    (e.g. a tool call's close tag); the turn ends at the token completing one.
  system: the system text of every episode, or None: in the chat scaffold a system
    turn where the chat format has one, else the opening of the first user turn
    (`rlpost.text.scaffold.prompt_ids`).
  tools: JSON schemas of the tools its episodes offer in a native tool format
    (`rlpost.envs.native_tools`); the template scaffold renders them in the chat
    template's tool section.
  """

  name: str
  reset: Callable[[Any, int], tuple[Any, str]]
  step: Callable[[Any, str], Step]
  max_turns: int
  stop_strings: tuple[str, ...] = ()
  system: str | None = None
  tools: tuple = ()


def check_env(env: Env) -> None:
  """Raises ValueError naming the field unless `env`'s limits are usable by a driver.

  max_turns: an integer >= 1 (0 would still play one turn, 2.5 three). stop_strings: a
  tuple of non-empty strings (a bare string would stop at each of its characters, an
  empty one after every turn's first token).
  """
  turns = env.max_turns
  if isinstance(turns, bool) or not isinstance(turns, numbers.Integral) or turns < 1:
    raise ValueError(
      f"environment {env.name!r}: max_turns={turns!r} must be an integer >= 1 "
      "(model turns per episode)"
    )
  stops = env.stop_strings
  if not isinstance(stops, (tuple, list)) or not all(isinstance(t, str) and t for t in stops):
    raise ValueError(
      f"environment {env.name!r}: stop_strings={stops!r} must be a tuple of non-empty "
      "strings, e.g. ('</tool>',) (a bare string would stop at each of its characters)"
    )


class RunInfo(NamedTuple):
  """What an environment's `build` may read besides its own config block.

  seed: the run's seed (e.g. the order training tasks are drawn in).
  eval_seed_offset: held-out seed k is eval_seed_offset + k.
  eval_tasks: held-out tasks evaluated.
  max_result_chars: the tools block's cap on a tool result's text.
  tokenizer: the policy's tokenizer (a dataset counts its prompts' tokens with it).
  """

  seed: int = 0
  eval_seed_offset: int = 1_000_000
  eval_tasks: int = 1
  max_result_chars: int = 200
  tokenizer: Any = None


class CompletionReport(NamedTuple):
  """What an environment of one scored completion per episode (a prompt dataset) reports
  instead of per-episode rates: the mean of each reward function's value (its info key
  `reward/<name>`, failures `reward/<name>/errors`), of each accuracy flag, and the
  completions' lengths."""

  reward_names: tuple = ()
  accuracy_names: tuple = ()


class Player(NamedTuple):
  """An environment that plays its own episodes instead of `multiturn.rollout`'s turn loop
  (an agent behind the endpoint, `rlpost.envs.agent`).

  play: (params, tasks, seeds, key, *, tokenizer, model_config, sampling_config, turns,
    num_generations) -> multiturn.Rollout, rows task-major as the rollout's (G per task
    first; further rows after them in whole groups of G).
  metrics: the Rollout's episodes -> {name: value}, merged into the iteration's metrics.
  """

  play: Callable[..., Any]
  metrics: Callable[[list], dict]


class EnvTasks(NamedTuple):
  """An environment and the tasks its episodes are about.

  train_tasks(seeds) / eval_tasks(seeds): one task per seed (None: the
  environment derives it from the seed, as FrozenLake draws its map).
  pool: None: iteration i trains on seeds i*B .. i*B+B-1 (B tasks per step); an int:
    on seeds drawn from range(pool) by the run's data cursor, in order or shuffled each
    epoch (`shuffle`), as a dataset's problems are.
  scaffold: the token scaffold its observations need ("chat" | "plain"), or None: the
    rollout block's `template` chooses.
  report: None: per-episode rates (success, turns, tools, ...); a CompletionReport: a
    one-turn dataset's per-reward-function metrics.
  content_key: (task, seed) -> what an episode is about, hashable (FrozenLake: the map's
    rows; a dataset: its normalised question), the same for the same content whatever
    the seed; or None: the environment names none, and held-out evaluation is by seed
    alone (`rlpost.envs.held_out`: overlap with training reported as unknown).
  player: None: episodes are `env`'s, played by `multiturn.rollout`; a Player: its own.
  """

  env: Env
  train_tasks: Callable[[list[int]], list]
  eval_tasks: Callable[[list[int]], list]
  pool: int | None = None
  shuffle: bool = False
  scaffold: str | None = None
  report: CompletionReport | None = None
  content_key: Callable[[Any, int], Hashable] | None = None
  player: Player | None = None
