r"""What scripted policies score on a textarena game's held-out seeds: yardsticks for a
trained model's greedy results (`experiments.agentic`'s evaluation games, the same
opponent's draws: `rlpost.envs.textarena_games`).

  python -m experiments.textarena_baselines [--game=TicTacToe-v0] [--max_turns=5]
      [--num_games=200] [--seed_offset=1000000] [--random_draws=10]

Each policy plays every seed through the env's own reset/step (so the scripted opponent
of a two-player game draws as it does in training and evaluation) and picks among the
moves the last "Available Moves:" line of its observation lists:

- `first_listed`: always the first listed move (TicTacToe: the lowest free cell), the
  map-blind policy a model can learn without reading the board;
- `random_listed`: a uniformly random listed move, `--random_draws` games per seed
  (drawn from `np.random.default_rng((draw, seed, turn))`), counts divided by the draws.

Prints one JSON object: per policy the games won (reward > 0), drawn (0), lost (< 0),
cut short (`--max_turns` moves without an end) and invalid moves, as the evaluation
counts them (`info["success"]`: a win for a two-player game).

  python -m experiments.textarena_baselines --outcomes=WORKDIR/eval_outcomes.jsonl

reads a run's greedy evaluations instead (`rlpost.recipes.reports.write_outcomes`) and
prints one JSON object per evaluation step: its counts as above, and `first_listed_games`,
the games whose moves (each reply's first bracketed move) are those `first_listed` plays
on the seed. Each game's replies are replayed through reset/step, and a game that does
not end as recorded is an error (give the run's --game and --max_turns).
"""

import json

import numpy as np
from absl import flags

from experiments import cli
from rlpost import errors
from rlpost.envs import textarena_games
from rlpost.recipes import reports


def listed_moves(observation: str) -> list[str]:
  """The moves of the last "Available Moves:" line of `observation`, e.g. ['[1]', '[4]']."""
  moves = textarena_games.listed_moves(observation)
  if not moves:
    raise errors.DataError(
      f"no 'Available Moves:' line in the observation {observation[-300:]!r}: the scripted "
      "policies play games that list their moves (TicTacToe-v0, WildTicTacToe-v0, ...)"
    )
  return moves


def first_listed(observation: str, turn: int) -> str:
  """The first move `observation` lists."""
  del turn
  return listed_moves(observation)[0]


def play(env, seed: int, choose, max_turns: int) -> dict:
  """One game of `choose(observation, turn) -> reply` through env.reset/step: its outcome
  ("won", "drawn", "lost" or "cut"), invalid moves and the moves made."""
  state, observation = env.reset(None, seed)
  moves, invalid = [], 0
  for turn in range(max_turns):
    move = choose(observation, turn)
    step = env.step(state, move)
    moves.append(move)
    invalid += bool(step.info.get("invalid_action"))
    state, observation = step.state, step.observation
    if step.done:
      outcome = "won" if step.info["success"] else "drawn" if step.reward == 0 else "lost"
      return {"outcome": outcome, "invalid": invalid, "moves": moves}
  return {"outcome": "cut", "invalid": invalid, "moves": moves}


def tally(games: list[dict], per: int = 1) -> dict:
  """Counts over `games` (`play`'s results), divided by `per` (games per seed)."""
  counts = {k: sum(g["outcome"] == k for g in games) / per for k in ("won", "drawn", "lost")}
  counts["cut"] = sum(g["outcome"] == "cut" for g in games) / per
  counts["invalid_moves"] = sum(g["invalid"] for g in games) / per
  return counts


def baselines(game: str, max_turns: int, seeds: range, random_draws: int) -> dict:
  """The JSON report (see the module docstring)."""
  if random_draws < 1:
    raise errors.FlagError(f"--random_draws={random_draws}: must be >= 1")
  config = textarena_games.TextArenaConfig(game=game, max_turns=max_turns)
  env = textarena_games.make_env(config)
  first = [play(env, s, first_listed, max_turns) for s in seeds]
  drawn = []
  for draw in range(random_draws):
    for s in seeds:

      def pick(observation, turn, draw=draw, s=s):
        moves = listed_moves(observation)
        return moves[np.random.default_rng((draw, s, turn)).integers(len(moves))]

      drawn.append(play(env, s, pick, max_turns))
  return {
    "game": game,
    "games": len(seeds),
    "max_turns": max_turns,
    "first_listed": tally(first),
    "random_listed": {**tally(drawn, random_draws), "draws": random_draws},
  }


def in_turn(replies: list[str]):
  """A `play` choice that makes `replies` in order ("" once they run out)."""
  left = iter(replies)
  return lambda observation, turn: next(left, "")


def replayed(record: dict, env, max_turns: int) -> dict:
  """A run's evaluation (one `eval_outcomes.jsonl` record) replayed: `tally`'s counts and
  `first_listed_games` (see the module docstring)."""
  games, same = [], 0
  for e in record["episodes"]:
    game = play(env, e["seed"], in_turn(e["replies"]), max_turns)
    if len(game["moves"]) != len(e["replies"]) or (game["outcome"] == "won") != e["success"]:
      raise errors.DataError(
        f"step {record['step']}, seed {e['seed']}: the {len(e['replies'])} replies replayed "
        f"end after {len(game['moves'])} moves as {game['outcome']!r}, but the run recorded "
        f"success={e['success']}: give the run's --game and --max_turns"
      )
    first = play(env, e["seed"], first_listed, max_turns)["moves"]
    made = [textarena_games.first_bracketed(reply) for reply in e["replies"]]
    same += made == first
    games.append(game)
  return {"step": record["step"], **tally(games), "first_listed_games": same}


def main(argv):
  del argv
  f = flags.FLAGS
  try:
    game = textarena_games.TextArenaConfig(f.game, f.max_turns)
  except ValueError as e:  # the game or max_turns: named by the config's own check
    raise errors.FlagError(f"--game={f.game} --max_turns={f.max_turns}: {e}") from None
  if f.outcomes:
    env = textarena_games.make_env(game)
    for record in reports.read_outcomes(f.outcomes):
      print(json.dumps(replayed(record, env, f.max_turns)))
    return
  seeds = range(f.seed_offset, f.seed_offset + f.num_games)
  print(json.dumps(baselines(f.game, f.max_turns, seeds, f.random_draws)))


if __name__ == "__main__":  # flags defined here only: importing the functions defines none
  flags.DEFINE_string("game", "TicTacToe-v0", "A textarena game (env.game).")
  flags.DEFINE_integer("max_turns", 5, "The policy's moves per game (env.max_turns).")
  flags.DEFINE_integer("num_games", 200, "Held-out games (eval.num_tasks).", lower_bound=1)
  flags.DEFINE_integer(
    "seed_offset", 1_000_000, "First held-out seed (eval.seed_offset).", lower_bound=0
  )
  flags.DEFINE_integer("random_draws", 10, "Games per seed of the random policy.")
  flags.DEFINE_string("outcomes", "", "A run's eval_outcomes.jsonl (or its .gz) to read instead.")
  cli.run(main)
