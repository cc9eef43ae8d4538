"""gymnasium's toy-text games as text environments (`env.name=gymnasium`, the `gymnasium`
extra): FrozenLake (any map, slippery or not), Taxi, CliffWalking, Blackjack.

`env.id` is a gymnasium id (`IDS`; Taxi-v3 is gone in gymnasium 1.4, Taxi-v4 replaces it)
and `env.kwargs` its constructor's arguments (a dict or a JSON object string, e.g.
'{"is_slippery": true, "map_name": "8x8"}'), built once when the config is read: what
gymnasium refuses, or builds unsound (`table_problem`: a map without 'S' or 'G', a
probability outside [0, 1]), is a ConfigError naming `env.kwargs`. With
`env.random_map_size` = n > 0, FrozenLake plays a map per seed, gymnasium's
`generate_random_map(n, random_map_p, seed)`.

Transitions, rewards and termination are gymnasium's own: a step restores the game's
position into a gymnasium env, calls its `step`, and reads the position back. Immutable
state without replaying: `State.snapshot` holds the unwrapped env's small attributes
(position, cards, last action: ints, bools, lists of ints) and its random generator's
state, so stepping a state twice gives the same outcome and never changes the state. The
gymnasium envs are per thread (rollout steps run on a thread pool), built once per
thread and map. Episodes are cut at `max_turns` by the driver (gymnasium's TimeLimit is
not applied).

A reply names one move word (the view's `actions`, whole word, case-insensitive; in an
<answer> span when there is one); one that names none or several costs `invalid_penalty`
and leaves the game where it was.
"""

import dataclasses
import json
import re
import threading
from typing import Any, NamedTuple

import numpy as np

from rlpost.envs import block_fields
from rlpost.envs import protocol
from rlpost.envs import toy_text_views as views
from rlpost.rewards import extras

IDS = (
  "FrozenLake-v1",
  "FrozenLake8x8-v1",
  "Taxi-v4",
  "CliffWalking-v1",
  "CliffWalkingSlippery-v1",
  "Blackjack-v1",
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SMALL = (int, float, bool, str, type(None))


class State(NamedTuple):
  """An episode's position; immutable."""

  task: tuple | None  # the FrozenLake map of a random-map run, else None
  snapshot: tuple  # ((attribute, value), ...) of the unwrapped env, lists as tuples
  rng: str  # the env's np_random bit-generator state, as JSON
  obs: Any  # gymnasium's observation of this position
  turn: int
  done: bool


def _gym():
  return extras.load("gymnasium", "config.env.name='gymnasium'")


def snapshot(env) -> tuple[tuple, str]:
  """(the small attributes of an unwrapped env, its generator's state as JSON)."""
  items = []
  for name, value in vars(env).items():
    if isinstance(value, list) and all(isinstance(v, _SMALL) for v in value):
      items.append((name, tuple(value), True))
    elif isinstance(value, _SMALL) or hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
      items.append((name, value.item() if hasattr(value, "item") else value, False))
  return tuple(items), json.dumps(env.np_random.bit_generator.state)


def restore(env, state: State) -> None:
  """Puts `state`'s position and generator state into `env` (unwrapped)."""
  for name, value, is_list in state.snapshot:
    setattr(env, name, list(value) if is_list else value)
  env.np_random.bit_generator.state = json.loads(state.rng)


def parse_action(text: str, actions: tuple[str, ...]) -> int | None:
  """The index of the one move word `text` names (in its first <answer> span if any)."""
  span = _ANSWER.search(text)
  text = span.group(1) if span else text
  found = {w.lower() for w in re.findall(rf"\b({'|'.join(actions)})\b", text, re.IGNORECASE)}
  return actions.index(found.pop()) if len(found) == 1 else None


@dataclasses.dataclass(frozen=True)
class GymConfig:
  """The `env` block (module docstring); checked on construction."""

  id: str = "FrozenLake-v1"
  kwargs: Any = ""
  random_map_size: int = 0
  random_map_p: float = 0.8
  max_turns: int = 20
  invalid_penalty: float = 0.1

  def __post_init__(self):
    if self.id not in IDS:
      hint = " (gymnasium 1.4 refuses Taxi-v3: use Taxi-v4)" if self.id == "Taxi-v3" else ""
      raise ValueError(f"id={self.id!r}: use one of {IDS}{hint}")
    kwargs = block_fields.mapping(self.kwargs, "kwargs")
    object.__setattr__(self, "kwargs", block_fields.frozen_json(kwargs, "kwargs"))
    if not isinstance(self.max_turns, int) or self.max_turns < 1:
      raise ValueError(f"max_turns={self.max_turns!r}: must be an integer >= 1")
    if not isinstance(self.invalid_penalty, (int, float)) or self.invalid_penalty < 0:
      raise ValueError(f"invalid_penalty={self.invalid_penalty!r}: must be a number >= 0")
    size = self.random_map_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size == 1:
      raise ValueError(f"random_map_size={size!r}: 0 (off) or an integer >= 2 (n x n maps)")
    if size and not self.id.startswith("FrozenLake"):
      raise ValueError(f"random_map_size={size}: only FrozenLake draws maps; use 0")
    if not 0 < self.random_map_p <= 1:
      raise ValueError(
        f"random_map_p={self.random_map_p!r}: a frozen cell's probability, in (0, 1]"
      )
    try:
      env = make_gym(self, None)
    # gymnasium's constructors check their arguments with any exception (an unknown map
    # name is a KeyError, a malformed map an IndexError or AssertionError)
    except Exception as err:  # pylint: disable=broad-exception-caught
      raise ValueError(
        f"kwargs={kwargs!r}: {self.id} refuses them ({type(err).__name__}: {err})"
      ) from None
    problem = table_problem(env, self.id)
    if problem:
      raise ValueError(f"kwargs={kwargs!r}: {problem}")


def table_problem(env, id_: str) -> str | None:
  """What is wrong with a built env's tables, which gymnasium builds from any arguments
  without a word (a FrozenLake map without 'S' starts from a NaN distribution, one without
  'G' cannot be won, an unknown letter plays as ice, success_rate=2 gives negative
  probabilities); None when sound. Several 'S' are gymnasium's: a start drawn among them."""
  if id_.startswith("FrozenLake"):
    letters = sorted({bytes(c).decode("latin-1") for c in env.desc.flat} - set("SFHG"))
    if letters or not (env.desc == b"S").any() or not (env.desc == b"G").any():
      return (
        f"a FrozenLake map needs an 'S', a 'G' and only the letters S F H G "
        f"(found {(env.desc == b'S').sum()} 'S', {(env.desc == b'G').sum()} 'G'"
        + (f", letters {letters})" if letters else ")")
      )
  start = np.asarray(getattr(env, "initial_state_distrib", [1.0]), np.float64)
  if not (np.isfinite(start).all() and (start >= 0).all() and np.isclose(start.sum(), 1)):
    return "its start distribution is not a probability distribution"
  for state, moves in getattr(env, "P", {}).items():
    for action, outcomes in moves.items():
      probs = np.array([o[0] for o in outcomes], np.float64)
      if not ((probs >= 0).all() and (probs <= 1).all() and np.isclose(probs.sum(), 1)):
        return (
          f"the transition probabilities of state {state}, action {action} are "
          f"{probs.tolist()}, not a distribution (e.g. a success_rate outside [0, 1])"
        )
  return None


def make_gym(config: GymConfig, task: tuple | None):
  """A fresh unwrapped gymnasium env of `config` (with the map `task`, when given)."""
  kwargs = json.loads(config.kwargs)
  if task is not None:
    kwargs = {**kwargs, "desc": list(task), "map_name": None}
  return _gym().make(config.id, **kwargs).unwrapped


class Games:
  """Per-thread gymnasium envs, one per map: the only mutable thing, never shared across
  threads, restored from a State before every use."""

  def __init__(self, config: GymConfig):
    self.config, self.local = config, threading.local()

  def get(self, task):
    envs = self.local.__dict__.setdefault("envs", {})
    if task not in envs:
      if len(envs) >= 64:  # random maps: keep a bounded cache
        envs.clear()
      envs[task] = make_gym(self.config, task)
    return envs[task]


def make_env(config: GymConfig) -> protocol.Env:
  """The environment; a task is a FrozenLake map (a random-map run) or None."""
  games = Games(config)
  view = views.VIEWS[type(games.get(None)).__name__]
  invalid = f"Your reply was not understood. Answer with one of: {', '.join(view.actions)}."

  def reset(task, seed: int):
    env = games.get(task)
    obs, _ = env.reset(seed=int(seed))
    items, rng = snapshot(env)
    state = State(task, items, rng, obs, 0, False)
    return state, f"{view.intro}\n\n{views.status(view, env)}"

  def step(state: State, text: str) -> protocol.Step:
    if state.done:
      raise ValueError("step called on a finished episode (state.done is True); reset first")
    env = games.get(state.task)
    action = parse_action(text, view.actions)
    restore(env, state)
    if action is None:
      new = state._replace(turn=state.turn + 1)
      info = {"success": False, "invalid_action": True}
      obs = f"{invalid}\n{views.status(view, env)}"
      return protocol.Step(new, obs, -float(config.invalid_penalty), False, info)
    obs, reward, terminated, _, _ = env.step(action)
    items, rng = snapshot(env)
    new = State(state.task, items, rng, obs, state.turn + 1, bool(terminated))
    info = {"success": bool(view.success(env, reward, terminated)), "invalid_action": False}
    text_out = "" if terminated else views.status(view, env)
    return protocol.Step(new, text_out, float(reward), bool(terminated), info)

  return protocol.Env("gymnasium", reset, step, max_turns=config.max_turns)


def build(config: GymConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """Seeds are gymnasium's reset seeds; a random-map run's task is the seed's map, which is
  also what an episode is about (`content_key`: held-out maps are none a training seed
  draws). The fixed-map envs (Taxi, CliffWalking, Blackjack, one FrozenLake map) have no
  content to hold out beyond their start states: their evaluation is by seed, its overlap
  reported as unknown."""
  del run
  env = make_env(config)
  if not config.random_map_size:
    none = lambda seeds: [None] * len(seeds)
    return protocol.EnvTasks(env, none, none)
  generate = _gym().envs.toy_text.frozen_lake.generate_random_map
  maps = lambda seeds: [
    tuple(generate(config.random_map_size, config.random_map_p, int(s))) for s in seeds
  ]
  return protocol.EnvTasks(env, maps, maps, content_key=lambda task, seed: task)
