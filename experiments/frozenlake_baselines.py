r"""What FrozenLake's held-out maps give a policy that never reads the map, and one that
reads only the neighbours line: yardsticks for a trained model's greedy success
(`experiments.agentic`'s evaluation maps).

  python -m experiments.frozenlake_baselines [--size=4] [--hole_prob=0.2] [--turns=8]
      [--num_maps=100] [--seed_offset=1000000]

Every sequence of `turns` moves is played on every map (non-slippery, as
`rlpost.envs.frozenlake`'s step: a move off the grid stays in place, H and G end the
walk). Prints one JSON object: `random` (the exact expected success of uniformly random
moves: the mean over all sequences), the two staircases (`down, right, ...` and
`right, down, ...`) and `best_fixed`, the one sequence that solves the most maps, each
with its count of maps solved; and `neighbour_reader`, the staircase that reads each
observation's neighbours line (`Around you: left edge, down hole, ...`; the
`frozenlake_near` variants) and steps around holes and edges, played through the env's
own reset/step, with its counts of maps solved, walks into a hole and walks cut short.

  python -m experiments.frozenlake_baselines --outcomes=WORKDIR/eval_outcomes.jsonl

reads a run's greedy evaluations instead (`rlpost.recipes.reports.write_outcomes`) and
prints one JSON object per evaluation step: its counts of maps solved, walks into a hole
and walks cut short, and how far the walks are one map-blind sequence (`map_reading`).
Each episode's replies are replayed on the map its seed draws (with --size and
--hole_prob), and a walk that does not end as recorded is an error.
"""

import itertools
import json

from absl import flags
import numpy as np

from experiments import cli
from rlpost import errors
from rlpost.envs import frozenlake
from rlpost.recipes import reports

MAX_TURNS = 10  # 4^10 sequences x maps is as far as enumerating goes


def successes(maps, sequences_SxK) -> np.ndarray:
  """`[S, M]` bool: whether the moves of each sequence (`[S, K]` action ids, `ACTIONS`
  order) reach G on each map, walking from S and stopping at the first H or G."""
  tiles_MxNxN = np.array([[list(row) for row in m] for m in maps])
  starts = np.array([np.argwhere(tiles == "S")[0] for tiles in tiles_MxNxN])
  n_seq, m_idx = len(sequences_SxK), np.arange(len(maps))
  row, col = (np.broadcast_to(starts[:, i], (n_seq, len(maps))).copy() for i in (0, 1))
  alive = np.ones(row.shape, bool)
  won = np.zeros(row.shape, bool)
  deltas = np.array(frozenlake.DELTAS)
  for action_S in np.asarray(sequences_SxK).T:
    new_row = row + deltas[action_S, 0][:, None]
    new_col = col + deltas[action_S, 1][:, None]
    inside = (new_row >= 0) & (new_row < tiles_MxNxN.shape[1])
    inside &= (new_col >= 0) & (new_col < tiles_MxNxN.shape[2])
    row = np.where(alive & inside, new_row, row)
    col = np.where(alive & inside, new_col, col)
    tile = tiles_MxNxN[m_idx[None, :], row, col]
    won |= alive & (tile == "G")
    alive &= (tile != "G") & (tile != "H")
  return won


def baselines(maps, turns: int) -> dict:
  """The JSON report for `maps` and episodes of `turns` moves (see the module docstring)."""
  if not 1 <= turns <= MAX_TURNS:
    raise errors.FlagError(
      f"--turns={turns}: every one of 4^turns move sequences is played; use 1..{MAX_TURNS}"
    )
  actions = frozenlake.ACTIONS
  sequences = np.array(list(itertools.product(range(len(actions)), repeat=turns)))
  won_SxM = successes(maps, sequences)
  solved_S = won_SxM.sum(axis=1)
  names = lambda seq: [actions[a] for a in seq]
  down, right = actions.index("down"), actions.index("right")
  report = {"maps": len(maps), "turns": turns, "random": float(won_SxM.mean())}
  for name, pair in (
    ("staircase_down_first", (down, right)),
    ("staircase_right_first", (right, down)),
  ):
    seq = [pair[t % 2] for t in range(turns)]
    index = int(np.flatnonzero((sequences == seq).all(axis=1))[0])
    report[name] = {"moves": names(seq), "solved": int(solved_S[index])}
  best = int(np.argmax(solved_S))
  report["best_fixed"] = {"moves": names(sequences[best]), "solved": int(solved_S[best])}
  return report


def read_neighbours(observation: str) -> dict[str, str]:
  """{move: what it leads to} from the last `Around you: ...` line of `observation`, e.g.
  {"left": "edge", "down": "hole", "right": "frozen", "up": "start"}."""
  prefix = "Around you: "
  lines = [line for line in observation.splitlines() if line.startswith(prefix)]
  if not lines:
    raise errors.DataError(f"no neighbours line ({prefix!r}) in the observation {observation!r}")
  return dict(part.split(" ", 1) for part in lines[-1][len(prefix) :].rstrip(".").split(", "))


def neighbour_reader_move(observation: str, previous: str | None) -> str:
  """`down` and `right` in turn (`down` first), else the other of the two, `left`, `up`:
  the first whose neighbour is neither a hole nor the edge (all are: the turn's own)."""
  first = "right" if previous == "down" else "down"
  order = (first, "down" if first == "right" else "right", "left", "up")
  around = read_neighbours(observation)
  return next((m for m in order if around[m] not in ("hole", "edge")), first)


def neighbour_reader(maps, turns: int) -> dict:
  """`neighbour_reader_move` played on `maps` (square, one size) through the env's
  reset/step with the neighbours line on: {"solved", "holes", "truncated"} counts."""
  env = frozenlake.make_env(len(maps[0]), max_turns=turns, neighbours=True)
  counts = {"solved": 0, "holes": 0, "truncated": 0}
  for m in maps:
    state, observation = env.reset(m, 0)
    previous, outcome = None, "truncated"
    for _ in range(turns):
      previous = neighbour_reader_move(observation, previous)
      step = env.step(state, previous)
      state, observation = step.state, step.observation
      if step.done:
        outcome = "solved" if step.info["success"] else "holes"
        break
    counts[outcome] += 1
  return counts


def replayed_walks(record: dict, size: int, hole_prob: float, style: str = "word") -> list:
  """Each episode of an `eval_outcomes.jsonl` record replayed through the env's reset/step
  on the map its seed draws: [(moves, outcome)], moves a tuple of action ids (-1: a reply
  that names no move), outcome "solved", "holes" or "truncated". Raises errors.DataError when
  a replay ends otherwise than the record says (another map size or hole probability)."""
  env = frozenlake.make_env(size, hole_prob, style=style)  # step ignores max_turns
  walks = []
  for e in record["episodes"]:
    state, _ = env.reset(None, e["seed"])
    moves, success = [], False
    for reply in e["replies"]:
      if state.done:  # the walk ended before its replies did
        break
      action = frozenlake.parse_action(reply, style)
      moves.append(-1 if action is None else action)
      step = env.step(state, reply)
      state, success = step.state, bool(step.info["success"])
    done = state.done
    if len(moves) < len(e["replies"]) or (done, success) != (e["done"], e["success"]):
      raise errors.DataError(
        f"step {record['step']}, seed {e['seed']}: the replies replayed on the map of "
        f"--size={size} --hole_prob={hole_prob} end after {len(moves)} moves with "
        f"done={done}, success={success}, but the run recorded {len(e['replies'])} replies, "
        f"done={e['done']}, success={e['success']}: give the run's "
        "env.size and env.hole_prob"
      )
    walks.append((tuple(moves), "solved" if success else "holes" if done else "truncated"))
  return walks


def map_reading(walks) -> dict:
  """How far greedy walks ([(moves, outcome)], `replayed_walks`) are one fixed sequence.

  A policy that never reads the map plays one sequence on every map, and each walk is a
  prefix of it (cut by a hole or the goal). `one_sequence`: the most walks that are
  prefixes of one sequence (`sequence`: the longest of them, as move names, "?" for no
  move); `solved_off_sequence`: maps solved by a walk that is not among them.
  """
  prefix = lambda a, b: b[: len(a)] == a
  counts = [sum(prefix(other, moves) for other, _ in walks) for moves, _ in walks]
  best = walks[int(np.argmax(counts))][0]
  outcomes = [outcome for _, outcome in walks]
  names = [frozenlake.ACTIONS[a] if a >= 0 else "?" for a in best]
  return {
    **{k: outcomes.count(k) for k in ("solved", "holes", "truncated")},
    "one_sequence": max(counts),
    "sequence": names,
    "solved_off_sequence": sum(o == "solved" and not prefix(m, best) for m, o in walks),
  }


def main(argv):
  del argv
  f = flags.FLAGS
  if f.outcomes:
    for record in reports.read_outcomes(f.outcomes):
      walks = replayed_walks(record, f.size, f.hole_prob)
      print(json.dumps({"step": record["step"], **map_reading(walks)}))
    return
  seeds = range(f.seed_offset, f.seed_offset + f.num_maps)
  maps = [frozenlake.generate_map(f.size, s, f.hole_prob) for s in seeds]
  report = baselines(maps, f.turns)
  report["neighbour_reader"] = neighbour_reader(maps, f.turns)
  print(json.dumps(report))


if __name__ == "__main__":  # flags defined here only: importing the functions defines none
  flags.DEFINE_integer("size", 4, "Maps are size x size.", lower_bound=2)
  flags.DEFINE_float("hole_prob", 0.2, "Hole probability of the map generator.")
  flags.register_validator("hole_prob", lambda p: 0 <= p < 1, "must be in [0, 1)")
  flags.DEFINE_integer("turns", 8, "Moves per episode (env.max_turns).")
  flags.DEFINE_integer("num_maps", 100, "Held-out maps (eval.num_tasks).", lower_bound=1)
  flags.DEFINE_integer("seed_offset", 1_000_000, "First held-out seed.", lower_bound=0)
  flags.DEFINE_string("outcomes", "", "A run's eval_outcomes.jsonl (or its .gz) to read instead.")
  cli.run(main)
