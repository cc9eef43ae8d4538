"""Text views of gymnasium's toy-text games: the board with the agent marked by a letter
(gymnasium's renders mark it by colour), the game's status and its moves.

A view is a `View(actions, intro, describe, success)`: `actions` the move words by
gymnasium's action index, `intro` the rules shown once, `describe(env)` the text of the
unwrapped env's current position, `success(env, reward, terminated)` whether the
episode reached its goal. `VIEWS` maps the unwrapped env's class name to its view.
"""

from typing import Callable, NamedTuple

import numpy as np


class View(NamedTuple):
  actions: tuple[str, ...]
  intro: str
  describe: Callable
  success: Callable


def _moves(actions) -> str:
  return f"Moves: {', '.join(actions)}."


def _frozenlake(env) -> str:
  rows = [bytes(r).decode() for r in env.desc]
  r, c = divmod(int(env.s), env.ncol)
  rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
  return "\n".join(rows) + f"\nYou are at row {r + 1}, column {c + 1}."


def _taxi(env) -> str:
  taxi_row, taxi_col, passenger, dest = env.decode(int(env.s))
  rows = [bytes(r).decode() for r in env.desc]
  col = 2 * taxi_col + 1  # cell c is character 2c + 1 of a map row
  line = rows[taxi_row + 1]
  rows[taxi_row + 1] = line[:col] + "T" + line[col + 1 :]
  names = "RGYB"
  where = "in the taxi" if passenger == 4 else f"waiting at {names[passenger]}"
  return (
    "\n".join(rows) + f"\nTaxi T at row {taxi_row + 1}, column {taxi_col + 1}. "
    f"Passenger {where}; destination {names[dest]}."
  )


def _cliff(env) -> str:
  nrow, ncol = env.shape
  grid = [["." for _ in range(ncol)] for _ in range(nrow)]
  for r, c in zip(*np.nonzero(env._cliff)):  # pylint: disable=protected-access
    grid[r][c] = "C"
  grid[nrow - 1][0], grid[nrow - 1][ncol - 1] = "S", "G"
  r, c = np.unravel_index(int(env.s), env.shape)
  grid[r][c] = "P"
  return "\n".join("".join(row) for row in grid) + f"\nYou are at row {r + 1}, column {c + 1}."


def _blackjack(env) -> str:
  total, usable = sum(env.player), 1 in env.player and sum(env.player) + 10 <= 21
  total += 10 if usable else 0
  cards = ", ".join("A" if v == 1 else str(v) for v in env.player)
  dealer = "A" if env.dealer[0] == 1 else str(env.dealer[0])
  return f"Your cards: {cards} (total {total}). The dealer shows {dealer}."


VIEWS = {
  "FrozenLakeEnv": View(
    ("left", "down", "right", "up"),
    "Walk on the frozen lake from S to G without falling into a hole.\n"
    "S: start, F: frozen, H: hole, G: goal, P: you. Reaching G pays 1.",
    _frozenlake,
    lambda env, reward, terminated: reward > 0,
  ),
  "TaxiEnv": View(
    ("south", "north", "east", "west", "pickup", "dropoff"),
    "Drive the taxi T to the passenger, pick them up and drop them off at the destination.\n"
    "R, G, Y, B: stops; | is a wall. Each move costs 1, delivering pays 20, a wrong "
    "pickup or dropoff costs 10.",
    _taxi,
    lambda env, reward, terminated: bool(terminated),
  ),
  "CliffWalkingEnv": View(
    ("up", "right", "down", "left"),
    "Walk from S to G along the cliff C without stepping onto it.\n"
    "S: start, G: goal, C: cliff (back to S, costs 100), .: ground, P: you. Each move costs 1.",
    _cliff,
    lambda env, reward, terminated: bool(terminated) and reward > -100,
  ),
  "BlackjackEnv": View(
    ("stick", "hit"),
    "Play blackjack against the dealer: get closer to 21 than the dealer without going over.\n"
    "hit: take a card; stick: stop and let the dealer play. Winning pays 1, losing costs 1.",
    _blackjack,
    lambda env, reward, terminated: reward > 0,
  ),
}


def status(view: View, env) -> str:
  """The position's text then the moves."""
  return f"{view.describe(env)}\n{_moves(view.actions)}"
