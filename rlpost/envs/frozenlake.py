"""FrozenLake as a text environment: walk from S to G on a grid without falling into a hole.

A map is a tuple of equal-length strings over S (start, exactly one), F (frozen),
H (hole) and G (goal, exactly one). The agent moves left, down, right or up; a
move off the grid stays in place; stepping on H ends the episode with reward
-`hole_penalty` (default 0), reaching G ends it with reward 1 (info success True),
any other move gives 0. With the default a hole and a walk that runs out of turns
earn the same 0: a penalty gives the learner a reason to read where the holes are.
`progress_reward` (default 0) adds that much per cell a move brings the agent closer
to G (and takes it per cell further): a denser signal than the goal alone.

Slippery lakes move in the intended direction with probability 1/3 and in each
of the two perpendicular directions with 1/3 (never the opposite), drawn from
`np.random.default_rng((seed, turn))`: deterministic given the episode's seed
and the turn, with no random generator kept in the state.

With `neighbours` (word style) each observation also names what every move leads to
("Around you: left edge, down hole, right frozen, up start."): the board read for the
model, a local rule a small model can learn where reading the grid's columns is hard.

Replies are parsed in one of two styles, fixed when the env is made:
  "word": the reply names exactly one distinct action word (left, down, right,
    up), case-insensitive, as a whole word ("leftover" is not "left"; "left, I
    said left" is left; "left or right" is invalid). When the reply contains a
    complete <answer>...</answer> span, only the first such span is read.
  "char": the reply, stripped of surrounding whitespace, is exactly one of the
    letters L, D, R, U (case-insensitive).
A reply that does not parse leaves the state unchanged except `turn` + 1, costs
`invalid_penalty` and says which answers are valid.
"""

import dataclasses
import math
import re
from collections import deque
from typing import NamedTuple

import numpy as np

from rlpost.envs.protocol import Env, EnvTasks, RunInfo, Step

ACTIONS = ("left", "down", "right", "up")
DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (row, col) change per action
CHARS = ("L", "D", "R", "U")
STYLES = ("word", "char")
TILES = "SFHG"
MAX_MAP_DRAWS = 10_000

_WORD_RE = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


class State(NamedTuple):
  """One FrozenLake position; immutable (tuples, ints, bools)."""

  map: tuple[str, ...]
  row: int
  col: int
  turn: int  # replies taken so far, valid or not
  seed: int  # the episode's seed (slippery draws use (seed, turn))
  done: bool


# ---- maps ----


def validate_map(m) -> None:
  """Raises ValueError naming the problem unless `m` is a valid map."""
  if isinstance(m, str) or not isinstance(m, (tuple, list)):
    raise ValueError(f"map must be a tuple of strings (rows), got {type(m).__name__}: {m!r}")
  if not m or not all(isinstance(r, str) and r for r in m):
    raise ValueError(f"map must be a non-empty tuple of non-empty strings, got {m!r}")
  widths = sorted({len(r) for r in m})
  if len(widths) > 1:
    raise ValueError(f"map rows must have equal lengths, got lengths {widths} in {m!r}")
  unknown = sorted(set("".join(m)) - set(TILES))
  if unknown:
    raise ValueError(f"map has unknown letters {unknown} in {m!r}; use only S, F, H, G")
  for tile in "SG":
    n = "".join(m).count(tile)
    if n != 1:
      raise ValueError(f"map must have exactly one {tile!r}, found {n} in {m!r}")


def _find(m: tuple[str, ...], tile: str) -> tuple[int, int]:
  """(row, col) of the first `tile` in `m`."""
  for r, line in enumerate(m):
    if tile in line:
      return r, line.index(tile)
  raise ValueError(f"no {tile!r} in map {m!r}")


def has_path(m: tuple[str, ...]) -> bool:
  """Whether G is reachable from S through non-hole cells (breadth-first search)."""
  start, goal = _find(m, "S"), _find(m, "G")
  seen, queue = {start}, deque([start])
  while queue:
    cell = queue.popleft()
    if cell == goal:
      return True
    for dr, dc in DELTAS:
      r, c = cell[0] + dr, cell[1] + dc
      if 0 <= r < len(m) and 0 <= c < len(m[0]) and (r, c) not in seen and m[r][c] != "H":
        seen.add((r, c))
        queue.append((r, c))
  return False


def _check_size_and_hole_prob(size, hole_prob) -> None:
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 2:
    raise ValueError(f"size={size!r} must be an integer >= 2 (the map is size x size)")
  if not isinstance(hole_prob, (int, float)) or not 0 <= hole_prob < 1:
    raise ValueError(f"hole_prob={hole_prob!r} must be a number in [0, 1)")


def _check_seed(seed) -> None:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed={seed!r} must be a non-negative integer")


def generate_map(size: int, seed: int, hole_prob: float = 0.2) -> tuple[str, ...]:
  """A size x size map: S top-left, G bottom-right, other cells holes with `hole_prob`.

  Redraws (from `np.random.default_rng(seed)`) until G is reachable from S, so the
  same (size, seed, hole_prob) always gives the same map.
  """
  _check_size_and_hole_prob(size, hole_prob)
  _check_seed(seed)
  rng = np.random.default_rng(seed)
  for _ in range(MAX_MAP_DRAWS):
    holes = rng.random((size, size)) < hole_prob
    rows = [["H" if h else "F" for h in line] for line in holes]
    rows[0][0], rows[-1][-1] = "S", "G"
    m = tuple("".join(r) for r in rows)
    if has_path(m):
      return m
  raise RuntimeError(
    f"no map with a path from S to G in {MAX_MAP_DRAWS} draws for size={size}, "
    f"hole_prob={hole_prob}; lower hole_prob"
  )


# ---- actions ----


def _answer_span(text: str) -> str:
  """The first complete <answer>...</answer> span's content, else the whole text."""
  match = _ANSWER_RE.search(text)
  return match.group(1) if match else text


def parse_action(text: str, style: str) -> int | None:
  """The action index (into ACTIONS) `text` names in `style`, or None (see module doc)."""
  if style == "word":
    words = {w.lower() for w in _WORD_RE.findall(_answer_span(text))}
    return ACTIONS.index(words.pop()) if len(words) == 1 else None
  if style == "char":
    letter = text.strip().upper()
    return CHARS.index(letter) if letter in CHARS else None
  raise ValueError(f"style={style!r} must be one of {STYLES}")


def answer_hint(style: str) -> str:
  """The line telling the model how to answer in `style`."""
  if style == "word":
    return "Answer with one of: left, down, right, up."
  if style == "char":
    return "Answer with one letter: L, D, R or U."
  raise ValueError(f"style={style!r} must be one of {STYLES}")


def instructions(style: str, neighbours: bool = False) -> str:
  """The text opening an episode (before the board) in `style` (word style with
  `neighbours`: the worked example shows the neighbours line too)."""
  if style == "char":
    return f"S start, F ice, H hole, G goal, P you.\n{answer_hint(style)}"
  near = lambda words: f"Around you: {words}.\n" if neighbours else ""
  return (
    "Walk on the frozen lake from S to G without stepping into a hole.\n"
    "S: start, F: frozen (safe), H: hole (episode ends), G: goal, P: your position.\n"
    f"{answer_hint(style)}\n\n"
    "Example:\nSFF\nPHF\nFFG\nYou are at row 2, column 1.\n"
    f"{near('left edge, down frozen, right hole, up start')}Your move: down\n"
    "SFF\nFHF\nPFG\nYou are at row 3, column 1.\n"
    f"{near('left edge, down edge, right frozen, up frozen')}Your move: right"
  )


def invalid_message(style: str) -> str:
  """What the model reads after a reply that did not parse (short in char style:
  a byte-level tiny model reads every character)."""
  if style == "char":
    return "Invalid. Use L, D, R or U."
  return f"Your reply was not understood. {answer_hint(style)}"


# ---- dynamics ----


def render(state: State) -> str:
  """The board with the agent's cell shown as P, one row per line."""
  rows = list(state.map)
  line = rows[state.row]
  rows[state.row] = line[: state.col] + "P" + line[state.col + 1 :]
  return "\n".join(rows)


TILE_WORDS = {"S": "start", "F": "frozen", "H": "hole", "G": "goal"}


def neighbours_line(state: State) -> str:
  """What each move leads to, e.g. "Around you: left edge, down hole, right frozen, up
  start." (edge: off the map, where a move stays in place)."""
  words = []
  for action, name in enumerate(ACTIONS):
    r, c = move(state, action)  # off the map: stays in place
    words.append(
      f"{name} {'edge' if (r, c) == (state.row, state.col) else TILE_WORDS[state.map[r][c]]}"
    )
  return f"Around you: {', '.join(words)}."


def observation(state: State, style: str, neighbours: bool = False) -> str:
  """The board, then the agent's position on its own line (the last thing the model
  reads before answering: a small model need not find P in the grid); in word style
  with `neighbours`, then what each move leads to (`neighbours_line`)."""
  r, c = state.row, state.col
  if style == "char":
    where = f"At {r},{c}."
  else:  # ends with a cue a base (not chat-tuned) model continues with a move
    near = f"{neighbours_line(state)}\n" if neighbours else ""
    where = f"You are at row {r + 1}, column {c + 1}.\n{near}Your move:"
  return f"{render(state)}\n{where}"


def realized_action(action: int, seed: int, turn: int, slippery: bool) -> int:
  """The action actually taken: `action`, or on ice intended/perpendicular with 1/3 each."""
  if not slippery:
    return action
  k = int(np.random.default_rng((seed, turn)).integers(3))
  return (action, (action - 1) % 4, (action + 1) % 4)[k]


def move(state: State, action: int) -> tuple[int, int]:
  """(row, col) after `action` from `state`; off the grid stays in place."""
  dr, dc = DELTAS[action]
  r, c = state.row + dr, state.col + dc
  if 0 <= r < len(state.map) and 0 <= c < len(state.map[0]):
    return r, c
  return state.row, state.col


def _info(success: bool, invalid: bool) -> dict:
  return {"success": success, "invalid_action": invalid}


class Rules(NamedTuple):
  """How replies are read and steps are scored: `make_env`'s arguments past the map's."""

  style: str = "word"
  slippery: bool = False
  invalid_penalty: float = 0.1  # subtracted for a reply that names no move
  hole_penalty: float = 0.0  # subtracted for the step into a hole
  progress_reward: float = 0.0  # per cell a move brings the agent closer to G (or - further)
  edge_penalty: float = 0.0  # subtracted for a move off the map (the agent stays in place)
  neighbours: bool = False  # observations name what each move leads to (word style)


def goal_distance(m: tuple[str, ...], row: int, col: int) -> int:
  """Moves from (row, col) to G on an empty map (|rows apart| + |columns apart|)."""
  goal_row, goal_col = _find(m, "G")
  return abs(goal_row - row) + abs(goal_col - col)


def step_state(state: State, text: str, rules: Rules) -> Step:
  """One FrozenLake step from `state` given the reply `text`; `state` is not changed.

  Reward: 1 on G, -hole_penalty on H, -invalid_penalty for a reply naming no move,
  -edge_penalty for a move off the map (the agent stays in place); a move also earns
  progress_reward x (cells closer to G), the step into a hole included.
  """
  if state.done:
    raise ValueError("step called on a finished episode (state.done is True); reset first")
  style = rules.style
  action = parse_action(text, style)
  if action is None:
    new = state._replace(turn=state.turn + 1)
    obs = f"{invalid_message(style)}\n{observation(new, style, rules.neighbours)}"
    return Step(new, obs, -float(rules.invalid_penalty), False, _info(False, True))
  row, col = move(state, realized_action(action, state.seed, state.turn, rules.slippery))
  tile = state.map[row][col]
  done = tile in "HG"
  new = state._replace(row=row, col=col, turn=state.turn + 1, done=done)
  reward = 1.0 if tile == "G" else (-float(rules.hole_penalty) if tile == "H" else 0.0)
  closer = goal_distance(state.map, state.row, state.col) - goal_distance(state.map, row, col)
  reward += float(rules.progress_reward) * closer
  if (row, col) == (state.row, state.col):  # the move (as realised on ice) left the map
    reward -= float(rules.edge_penalty)
  obs = "" if done else observation(new, style, rules.neighbours)
  return Step(new, obs, reward, done, _info(tile == "G", False))


# ---- the env ----


def _check_penalty(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"{name}={value!r} must be a finite number (e.g. 0.1)")
  if value < 0:
    raise ValueError(
      f"{name}={value!r} must be >= 0 (invalid_penalty, hole_penalty and edge_penalty are "
      "subtracted; progress_reward is paid per cell closer to G)"
    )


def _check_env_args(size, hole_prob, max_turns, fixed_map, rules: Rules):
  _check_size_and_hole_prob(size, hole_prob)
  if not isinstance(rules.slippery, bool):
    raise ValueError(f"slippery={rules.slippery!r} must be True or False")
  if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
    raise ValueError(f"max_turns={max_turns!r} must be a positive integer")
  if rules.style not in STYLES:
    raise ValueError(f"style={rules.style!r} must be one of {STYLES}")
  for name in ("invalid_penalty", "hole_penalty", "progress_reward", "edge_penalty"):
    _check_penalty(name, getattr(rules, name))
  if not isinstance(rules.neighbours, bool):
    raise ValueError(f"neighbours={rules.neighbours!r} must be True or False")
  if rules.neighbours and rules.style != "word":
    raise ValueError(
      f"neighbours=True with style={rules.style!r}: the neighbours line is written in word "
      "style only (set style='word', or neighbours=False)"
    )
  if fixed_map is not None:
    validate_map(fixed_map)


def make_env(
  size: int = 4,
  hole_prob: float = 0.2,
  max_turns: int = 8,
  fixed_map: tuple[str, ...] | None = None,
  **rules,
) -> Env:
  """A FrozenLake `Env`; `rules`: the fields of `Rules` (style, slippery, penalties, ...).

  reset(task, seed): `task` is a map, or None for `fixed_map` when given, else
  `generate_map(size, seed, hole_prob)`. The first observation is
  `instructions(style, neighbours)` then `observation(state, style, neighbours)` (the
  board and the agent's position); later ones are `observation` alone (after an invalid
  reply, `invalid_message(style)` first); "" once done.
  """
  unknown = sorted(set(rules) - set(Rules._fields))
  if unknown:
    raise TypeError(f"make_env got {unknown}; its rules are {list(Rules._fields)}")
  rules = Rules(**rules)
  _check_env_args(size, hole_prob, max_turns, fixed_map, rules)
  fixed = None if fixed_map is None else tuple(fixed_map)
  style, neighbours = rules.style, rules.neighbours

  def reset(task, seed):
    _check_seed(seed)
    if task is None:
      m = fixed if fixed is not None else generate_map(size, seed, hole_prob)
    else:
      validate_map(task)
      m = tuple(task)
    row, col = _find(m, "S")
    state = State(map=m, row=row, col=col, turn=0, seed=int(seed), done=False)
    first = observation(state, style, neighbours)
    return state, f"{instructions(style, neighbours)}\n\n{first}"

  def step(state, text):
    return step_state(state, text, rules)

  return Env(name="frozenlake", reset=reset, step=step, max_turns=max_turns, stop_strings=())


@dataclasses.dataclass(frozen=True)
class FrozenLakeConfig:
  """The `env` block of a FrozenLake run (`make_env`'s arguments; fixed_map: rows,
  comma-separated, "" = a map drawn from each seed). Checked on construction."""

  size: int = 4
  slippery: bool = False
  hole_prob: float = 0.2
  max_turns: int = 8
  style: str = "word"
  invalid_penalty: float = 0.1
  fixed_map: str = ""
  hole_penalty: float = 0.0
  progress_reward: float = 0.0
  neighbours: bool = False
  edge_penalty: float = 0.0

  def __post_init__(self):
    _check_env_args(self.size, self.hole_prob, self.max_turns, self.rows(), self.rules())

  def rows(self) -> tuple[str, ...] | None:
    return tuple(r.strip() for r in self.fixed_map.split(",")) if self.fixed_map else None

  def rules(self) -> Rules:
    return Rules(**{name: getattr(self, name) for name in Rules._fields})


def build(config: FrozenLakeConfig, run: RunInfo) -> EnvTasks:
  """The table's constructor (`rlpost.envs.table`): maps come from the seeds."""
  env = make_env(
    config.size, config.hole_prob, config.max_turns, config.rows(), **config.rules()._asdict()
  )
  del run  # nothing of the run changes FrozenLake
  none = lambda seeds: [None] * len(seeds)
  return EnvTasks(env, none, none, content_key=map_key(config))


def map_key(config: FrozenLakeConfig):
  """The content key of a FrozenLake episode: `(task, seed) -> the map's rows` (the map
  `reset` plays), or None with a fixed map (every episode plays it, trained and held out
  alike: there is no held-out content)."""
  if config.fixed_map:
    return None
  size, hole_prob = config.size, config.hole_prob
  return lambda task, seed: tuple(task) if task is not None else generate_map(size, seed, hole_prob)
