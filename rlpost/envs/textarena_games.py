"""textarena games as environments (`env.name=textarena`, the `textarena` extra).

`env.game` is a textarena id (`SINGLE_PLAYER`, offline; or `TWO_PLAYER`, the policy as
player 0 against an opponent). `env.opponent="random"`: a uniformly random legal move,
drawn from `np.random.default_rng((seed, turn))` among the moves the game lists, each tried
on a copy and kept when the game accepts it. `env.opponent="MODULE:FUNCTION"`: your own
player 1, `FUNCTION(observation: str, seed: int, turn: int) -> str` (its observation as
the policy's are cued; the game's turn count), called outside the library's lock; a reply
the game refuses is replaced by the random legal move and counted (`info
["opponent_fallbacks"]`). Self-play with one side frozen is such a function asking a
frozen copy of the policy (`experiments/examples/endpoint_opponent.py`: the model served by
`experiments.serve`); the opponent is never trained. The reward is the game's own for
player 0, paid when the game ends; observations are the game's messages to player 0 since
its last move (its own move's echo left out).

Games that download word lists (nltk's `words`: Wordle, Hangman, ...), need a hosted judge
(an OpenRouter key) or do not import on this Python are refused by name (`REFUSED`).

State without hidden mutation: `State.game` is a deep copy of the textarena env, never
stepped itself: a step copies it and steps the copy. textarena draws from Python's global
`random` (seeded in its reset): every textarena call holds one lock and runs with the
episode's own `random` state (`State.rng`), restoring the caller's after, so episodes are
reproducible and threads do not disturb each other or the rest of the process.
"""

import copy
import dataclasses
import functools
import random
import re
import threading
from typing import Any, NamedTuple

import numpy as np

from rlpost import references
from rlpost.envs import protocol
from rlpost.rewards import extras

SINGLE_PLAYER = (
  "2048-v0", "Bandit-v0", "Blackjack-v0", "Countdown-v0", "Crosswords-v0", "Cryptarithm-v0",
  "FifteenPuzzle-v0", "FrozenLake-v0", "GuessTheNumber-v0", "LightsOut-v0", "LogicPuzzle-v0",
  "Mastermind-v0", "Minesweeper-v0", "PegJump-v0", "RushHour-v0", "Secretary-v0",
  "Slitherlink-v0", "Sokoban-v0", "Sudoku-v0", "ThreeCardMonte-v0", "TowerOfHanoi-v0",
)  # fmt: skip
# two-player games whose observations list the legal moves, or whose moves `_candidates` knows
TWO_PLAYER = ("TicTacToe-v0", "ConnectFour-v0", "Nim-v0", "WildTicTacToe-v0")
_WORDS = "downloads nltk's 'words' list at reset"
_JUDGE = "needs a hosted judge (an OpenRouter API key)"
_PY = "does not import on Python 3.11 (a SyntaxError in textarena 0.7.4)"
REFUSED = {
  **{g: _WORDS for g in ("Wordle", "Hangman", "Codenames", "DontSayIt", "LetterAuction")},
  **{g: _WORDS for g in ("SpellingBee", "WordChains", "WordLadder", "WordSearch")},
  **{g: _JUDGE for g in ("Debate", "GuessWho", "ScenarioPlanning", "TwentyQuestions")},
  **{g: _PY for g in ("Checkers", "Chess", "IteratedStagHunt", "Klondike", "ReverseTicTacToe")},
  "UltimateTexasHoldem": _PY,
  "ScorableGames": "reads game files textarena 0.7.4 does not ship",
  "UsedCarNegotiation": "reads game files textarena 0.7.4 does not ship",
  "BabyAiText": "needs the old 'gym' package",
}
_LOCK = threading.Lock()
_LISTED = re.compile(r"Available Moves:([^\n]*)")
_BRACKETED = re.compile(r"\[[^\]]+\]")


class State(NamedTuple):
  """An episode: the game (never stepped itself), its `random` state, turns taken."""

  game: Any
  rng: tuple
  seed: int
  turn: int


def _textarena():
  return extras.load("textarena", "config.env.name='textarena'")


def _call(rng: tuple | None, fn):
  """fn() under the lock with Python's `random` in state `rng` (None: as it is); returns
  (fn's result, the `random` state after it); the caller's `random` state is restored."""
  with _LOCK:
    saved = random.getstate()
    try:
      if rng is not None:
        random.setstate(rng)
      out = fn()
      return out, random.getstate()
    finally:
      random.setstate(saved)


def _text(messages, me: int = 0) -> str:
  """Messages (from_id, text, type; some games swap the last two) as lines; `me`'s own
  move echo left out."""
  lines = []
  for sender, *rest in messages:
    message = next((m for m in rest if isinstance(m, str)), "")
    kind = next((getattr(m, "name", "") for m in rest if not isinstance(m, str)), "")
    if sender == me and kind == "PLAYER_ACTION":
      continue
    named = isinstance(sender, int) and sender >= 0 and sender != me
    lines.append(f"Player {sender}: {message}" if named else message)
  return "\n".join(lines).strip()


def base_name(game: str) -> str:
  return game.split("-v")[0]


@dataclasses.dataclass(frozen=True)
class TextArenaConfig:
  """The `env` block: game (a textarena id), max_turns (the policy's moves), cue (a line
  put after every observation the policy reads, e.g. "Your move:" for a base model that
  continues text rather than follows instructions; "": none), opponent (a two-player
  game's player 1: "random" or "MODULE:FUNCTION", the module docstring)."""

  game: str = "TowerOfHanoi-v0"
  max_turns: int = 10
  cue: str = ""
  opponent: str = "random"

  def __post_init__(self):
    if base_name(self.game) in REFUSED:
      raise ValueError(
        f"game={self.game!r}: refused, it {REFUSED[base_name(self.game)]}; the offline games: "
        f"{SINGLE_PLAYER + TWO_PLAYER}"
      )
    if self.game not in SINGLE_PLAYER + TWO_PLAYER:
      raise ValueError(f"game={self.game!r}: use one of {SINGLE_PLAYER + TWO_PLAYER}")
    if not isinstance(self.max_turns, int) or self.max_turns < 1:
      raise ValueError(f"max_turns={self.max_turns!r}: must be an integer >= 1")
    if not isinstance(self.cue, str):
      raise ValueError(f'cue={self.cue!r}: must be a string ("": no cue)')
    if self.opponent != "random" and self.game not in TWO_PLAYER:
      raise ValueError(f"opponent={self.opponent!r}: {self.game} is single-player; use 'random'")
    opponent_function(self.opponent)
    _textarena()


def opponent_function(opponent: str):
  """None for "random", else the function "MODULE:FUNCTION" names (errors name the field)."""
  if opponent == "random":
    return None
  return references.function_at(opponent, "opponent", "fn(observation, seed, turn) -> str")


def _raw(game: str):
  """The game without textarena's wrappers (the `-raw` id)."""
  return _textarena().make(f"{game}-raw")


def listed_moves(observation: str) -> list[str]:
  """The moves of the last "Available Moves:" line of `observation`, e.g. ['[1]', '[4]'];
  [] when it lists none."""
  lines = _LISTED.findall(observation)
  return _BRACKETED.findall(lines[-1]) if lines else []


def first_bracketed(reply: str) -> str | None:
  """The first bracketed move in `reply` (e.g. '[4]'), or None."""
  found = _BRACKETED.search(reply)
  return found.group(0) if found else None


def _candidates(game: str, env, text: str) -> list[str]:
  """The moves player 1 may try: those the last "Available Moves:" line of its observation
  lists, else the game's moves."""
  listed = listed_moves(text)
  if listed:
    return listed
  if game == "ConnectFour-v0":
    return [f"[col {c}]" for c in range(env.num_cols)]
  if game == "Nim-v0":
    piles = env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]
  raise ValueError(f"{game}: no scripted opponent's moves (TWO_PLAYER lists the games)")


def _valid(env, turn_before: int, pid: int) -> bool:
  """Whether the move just made by `pid` was accepted (the turn advanced, or the game
  ended without calling it invalid)."""
  info = env.state.game_info.get(pid, {})
  return env.state.turn > turn_before or (env.state.done and not info.get("invalid_move"))


def _opponent_text(env) -> str | None:
  """Player 1's observation (taken from the game) when it is to move, else None."""
  if env.state.done or env.state.current_player_id == 0:
    return None
  return _text(env.get_observation()[1], me=1)


def _random_move(game: str, env, seed: int, text: str):
  """`env` after player 1's random legal move among those `text` lists (under `_call`;
  `env` itself is spent), drawn by the episode's seed and the game's turn count."""
  moves = _candidates(game, env, text)
  order = np.random.default_rng((seed, env.state.turn)).permutation(len(moves))
  for k in order:
    trial = copy.deepcopy(env)
    before = trial.state.turn
    trial.step(moves[k])
    if _valid(trial, before, 1):
      return trial
  env.step(moves[order[0]])  # no listed move is legal: the game rules on the first
  return env


def _until_mine(game: str, env, seed: int):
  """`env` once it is player 0's turn or the game is over (the random opponent moving)."""
  while (text := _opponent_text(env)) is not None:
    env = _random_move(game, env, seed, text)
  return env


def _cued(config: TextArenaConfig, text: str) -> str:
  """`text` as the policy (and a user's opponent) reads it: the cue on a line after it."""
  return f"{text}\n{config.cue}" if config.cue else text


def _replied(game: str, env, seed: int, text: str, reply: str):
  """(`env` after player 1's `reply`, False) when the game accepts it, else (`env` after
  the random legal move, True)."""
  trial = copy.deepcopy(env)
  before = trial.state.turn
  trial.step(reply)
  if _valid(trial, before, 1):
    return trial, False
  return _random_move(game, env, seed, text), True


def _settle(config: TextArenaConfig, choose, env, rng: tuple, seed: int):
  """(env, rng, fallbacks) once it is player 0's turn or the game is over, player 1's
  moves asked of `choose` outside the lock (`env` is this step's own copy)."""
  fallbacks = 0
  while True:
    text, rng = _call(rng, lambda: _opponent_text(env))
    if text is None:
      return env, rng, fallbacks
    reply = choose(_cued(config, text), seed, env.state.turn)
    if not isinstance(reply, str):
      raise TypeError(f"config.env.opponent={config.opponent!r} returned {reply!r}, not a str")
    (env, fell), rng = _call(rng, lambda: _replied(config.game, env, seed, text, reply))
    fallbacks += fell


def make_env(config: TextArenaConfig) -> protocol.Env:
  """The environment; tasks are None, the seed is the game's."""
  players = 2 if config.game in TWO_PLAYER else 1
  cued = functools.partial(_cued, config)
  choose = opponent_function(config.opponent)

  def settled(env, rng, seed):
    """(env, rng, fallbacks) at player 0's turn or the end (a random opponent has moved)."""
    return (env, rng, 0) if choose is None else _settle(config, choose, env, rng, seed)

  def observed(env):
    return env.state.done, "" if env.state.done else _text(env.get_observation()[1])

  def reset(task, seed: int):
    del task

    def start():
      env = _raw(config.game)
      env.reset(num_players=players, seed=int(seed))
      return env if choose else _until_mine(config.game, env, int(seed))

    env, rng = _call(None, start)
    env, rng, _ = settled(env, rng, int(seed))
    (_, text), rng = _call(rng, lambda: observed(env))
    return State(env, rng, int(seed), 0), cued(text)

  def step(state: State, text: str) -> protocol.Step:
    def play():
      env = copy.deepcopy(state.game)
      before = env.state.turn
      env.step(text)
      valid = _valid(env, before, 0)
      return (env if choose else _until_mine(config.game, env, state.seed)), valid

    (env, valid), rng = _call(state.rng, play)
    env, rng, fallbacks = settled(env, rng, state.seed)
    (done, obs), rng = _call(rng, lambda: observed(env))
    new = State(env, rng, state.seed, state.turn + 1)
    info = {"invalid_action": not valid}
    if choose is not None:
      info["opponent_fallbacks"] = fallbacks
    if not done:
      return protocol.Step(new, cued(obs or "(no change)"), 0.0, False, info)
    reward = float((env.state.rewards or {}).get(0, 0.0))
    info["success"] = reward > 0 if players == 2 else reward >= 1.0
    return protocol.Step(new, "", reward, True, info)

  return protocol.Env("textarena", reset, step, max_turns=config.max_turns)


def build(config: TextArenaConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  """Seeds are the games' reset seeds; tasks are None."""
  del run
  none = lambda seeds: [None] * len(seeds)
  return protocol.EnvTasks(make_env(config), none, none)
