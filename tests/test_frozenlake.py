"""FrozenLake: hand-checked transitions, parsing, slippery statistics, map generation."""

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from conftest import import_main

from rlpost.envs import frozenlake as fl
from rlpost.envs.protocol import Env, Step

MAP4 = ("SFFF", "FHFH", "FFFH", "HFFG")
OPEN5 = ("SFFFF", "FFFFF", "FFFFF", "FFFFF", "FFFFG")  # no holes: slips are visible

# (row, col, action) -> (new row, new col, reward, done, success), worked out by hand
# on MAP4:   S F F F / F H F H / F F F H / H F F G
TABLE = {
  (0, 0, "left"): (0, 0, 0.0, False, False),  # off the grid: stays
  (0, 0, "up"): (0, 0, 0.0, False, False),
  (0, 0, "right"): (0, 1, 0.0, False, False),
  (0, 0, "down"): (1, 0, 0.0, False, False),
  (0, 1, "down"): (1, 1, 0.0, True, False),  # hole
  (0, 3, "right"): (0, 3, 0.0, False, False),
  (0, 3, "up"): (0, 3, 0.0, False, False),
  (0, 3, "left"): (0, 2, 0.0, False, False),
  (0, 3, "down"): (1, 3, 0.0, True, False),
  (1, 0, "right"): (1, 1, 0.0, True, False),
  (1, 0, "left"): (1, 0, 0.0, False, False),
  (1, 0, "up"): (0, 0, 0.0, False, False),
  (2, 0, "down"): (3, 0, 0.0, True, False),
  (2, 2, "right"): (2, 3, 0.0, True, False),
  (2, 2, "up"): (1, 2, 0.0, False, False),
  (2, 2, "left"): (2, 1, 0.0, False, False),
  (2, 2, "down"): (3, 2, 0.0, False, False),
  (3, 1, "down"): (3, 1, 0.0, False, False),
  (3, 1, "left"): (3, 0, 0.0, True, False),
  (3, 2, "down"): (3, 2, 0.0, False, False),
  (3, 2, "right"): (3, 3, 1.0, True, True),  # goal
}


def at(row, col, m=MAP4, turn=0, seed=0):
  return fl.State(map=m, row=row, col=col, turn=turn, seed=seed, done=False)


@pytest.mark.parametrize("key", list(TABLE))
def test_transitions_match_hand_table(key):
  row, col, action = key
  out = make().step(at(row, col), action)
  want_row, want_col, reward, done, success = TABLE[key]
  assert (out.state.row, out.state.col) == (want_row, want_col)
  assert (out.reward, out.done, out.info["success"]) == (reward, done, success)
  assert out.info["invalid_action"] is False
  assert out.state.turn == 1 and out.state.done == done


def make(**kw):
  kw.setdefault("fixed_map", MAP4)
  return fl.make_env(**kw)


def play(env, state, texts):
  steps = []
  for text in texts:
    steps.append(env.step(state, text))
    state = steps[-1].state
  return steps


def test_reset_shows_instructions_and_board_with_player():
  env = make()
  state, obs = env.reset(None, 3)
  assert state == fl.State(MAP4, 0, 0, 0, 3, False)
  assert (
    obs
    == fl.instructions("word")
    + "\n\nPFFF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 1.\nYour move:"
  )
  assert "Answer with one of: left, down, right, up." in obs
  _, obs_char = make(style="char").reset(None, 3)
  assert obs_char.startswith(fl.instructions("char"))
  assert "Answer with one letter: L, D, R or U." in fl.instructions("char")
  assert isinstance(env, Env) and env.name == "frozenlake" and env.stop_strings == ()


def test_right_then_down_falls_into_the_hole():
  env = make()
  state, _ = env.reset(None, 0)
  first, second = play(env, state, ["right", "down"])
  assert (
    first.observation == "SPFF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 2.\nYour move:"
  )  # S kept
  assert (first.reward, first.done) == (0.0, False)
  assert (second.state.row, second.state.col) == (1, 1)
  assert (second.reward, second.done, second.info["success"]) == (0.0, True, False)
  assert second.observation == ""


def test_safe_path_reaches_the_goal():
  env = make()
  state, _ = env.reset(None, 0)
  steps = play(env, state, ["down", "down", "right", "right", "down", "right"])
  cells = [(s.state.row, s.state.col) for s in steps]
  assert cells == [(1, 0), (2, 0), (2, 1), (2, 2), (3, 2), (3, 3)]
  assert [s.reward for s in steps] == [0.0] * 5 + [1.0]
  assert [s.done for s in steps] == [False] * 5 + [True]
  assert steps[-1].info == {"success": True, "invalid_action": False}
  assert steps[-1].state.turn == 6


def test_hole_penalty_is_paid_by_the_hole_alone():
  # the same walks with and without a penalty: only the step into the hole pays it
  env = make(hole_penalty=0.5)
  state, _ = env.reset(None, 0)
  _, hole = play(env, state, ["right", "down"])
  assert (hole.reward, hole.done, hole.info["success"]) == (-0.5, True, False)
  steps = play(env, state, ["down", "down", "right", "right", "down", "right"])
  assert [s.reward for s in steps] == [0.0] * 5 + [1.0]
  assert env.step(state, "jump").reward == -0.1  # an invalid reply: invalid_penalty only
  assert env.step(state, "up").reward == 0.0  # off the grid: stays on S
  config = fl.FrozenLakeConfig(fixed_map=",".join(MAP4), hole_penalty=0.25)
  built = fl.build(config, None).env
  assert play(built, built.reset(None, 0)[0], ["right", "down"])[1].reward == -0.25


def test_progress_reward_pays_each_cell_closer_to_the_goal():
  # MAP4 = SFFF / FHFH / FFFH / HFFG: the safe path's 6 moves each bring G one cell closer
  env = make(progress_reward=0.1, hole_penalty=0.3)
  state, _ = env.reset(None, 0)
  steps = play(env, state, ["down", "down", "right", "right", "down", "right"])
  assert [s.reward for s in steps] == pytest.approx([0.1] * 5 + [1.1])
  assert sum(s.reward for s in steps) == pytest.approx(1.0 + 0.1 * fl.goal_distance(MAP4, 0, 0))
  assert env.step(state, "up").reward == 0.0  # off the grid: no closer
  assert env.step(steps[0].state, "up").reward == pytest.approx(-0.1)  # back up: further
  hole = play(env, state, ["right", "down"])[1]  # into (1, 1): closer, but a hole
  assert hole.reward == pytest.approx(0.1 - 0.3) and hole.done
  assert env.step(state, "jump").reward == -0.1  # an invalid reply: no move, no progress
  assert [fl.goal_distance(MAP4, r, c) for r, c in [(0, 0), (3, 3), (1, 2), (3, 0)]] == [6, 0, 3, 3]


def test_edge_penalty_is_paid_by_a_move_off_the_map_alone():
  # MAP4 = SFFF / FHFH / FFFH / HFFG: from S, up and left leave the map; on ice a move
  # asked inside the map that slides off it pays too
  env = make(edge_penalty=0.2, progress_reward=0.1)
  state, _ = env.reset(None, 0)
  for move in ("up", "left"):
    step = env.step(state, move)
    assert (step.reward, (step.state.row, step.state.col)) == (pytest.approx(-0.2), (0, 0))
  steps = play(env, state, ["down", "down", "right", "right", "down", "right"])
  assert [s.reward for s in steps] == pytest.approx([0.1] * 5 + [1.1])  # no edge: unchanged
  assert env.step(steps[0].state, "left").reward == pytest.approx(-0.2)  # (1, 0): left edge
  assert env.step(state, "jump").reward == -0.1  # an invalid reply: no move, no edge
  ice = make(edge_penalty=0.2, slippery=True)
  outcomes = set()
  for seed in range(40):  # "down" from S slides left (off the map) or right, or goes down
    s0, _ = ice.reset(None, seed)
    step = ice.step(s0, "down")
    outcomes.add(((step.state.row, step.state.col), step.reward))
  assert outcomes == {((0, 0), -0.2), ((1, 0), 0.0), ((0, 1), 0.0)}
  assert fl.FrozenLakeConfig(fixed_map=",".join(MAP4), edge_penalty=0.3).rules().edge_penalty == 0.3


def test_neighbours_line_names_what_each_move_leads_to():
  env = make(neighbours=True)  # MAP4: SFFF / FHFH / FFFH / HFFG
  state, first = env.reset(None, 0)
  assert first.endswith(
    "PFFF\nFHFH\nFFFH\nHFFG\nYou are at row 1, column 1.\n"
    "Around you: left edge, down frozen, right frozen, up edge.\nYour move:"
  )
  assert "Around you: left edge, down frozen, right hole, up start." in first  # the example
  right = env.step(state, "right")
  assert right.observation.endswith(
    "Around you: left start, down hole, right frozen, up edge.\nYour move:"
  )
  steps = play(env, state, ["down", "down", "right", "right", "down"])
  assert steps[-1].observation.endswith(
    "Around you: left frozen, down edge, right goal, up frozen.\nYour move:"
  )
  invalid = env.step(state, "jump").observation
  assert invalid.startswith(fl.invalid_message("word")) and "Around you: left edge" in invalid
  # the same walk without the line: every observation is the board and position alone
  plain = play(make(), make().reset(None, 0)[0], ["down", "down", "right", "right", "down"])
  assert [s.observation.replace(fl.neighbours_line(s.state) + "\n", "") for s in steps] == [
    s.observation for s in plain
  ]
  assert [s.reward for s in steps] == [s.reward for s in plain]


def test_step_after_done_raises():
  env = make()
  state, _ = env.reset(None, 0)
  hole = play(env, state, ["right", "down"])[-1].state
  with pytest.raises(ValueError, match="finished episode"):
    env.step(hole, "left")


def test_step_does_not_mutate_and_old_state_replays():
  env = make(slippery=True)
  state, _ = env.reset(None, 5)
  saved = fl.State(*state)
  first = env.step(state, "right")
  assert state == saved
  assert env.step(state, "right") == first
  invalid = env.step(state, "fly")
  assert state == saved and invalid.state is not state


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.lists(st.sampled_from(fl.ACTIONS + ("??",)), max_size=8))
def test_slippery_trajectories_are_reproducible(seed, actions):
  env = make(slippery=True, fixed_map=OPEN5)

  def run():
    state, obs = env.reset(None, seed)
    steps = []
    for a in actions:
      if state.done:
        break
      steps.append(env.step(state, a))
      state = steps[-1].state
    return obs, steps

  assert run() == run()


def test_slippery_trajectories_depend_on_seed():
  env = make(slippery=True, fixed_map=OPEN5)
  paths = set()
  for seed in range(10):
    state, _ = env.reset(None, seed)
    steps = play(env, state, ["right", "down", "right", "down"])
    paths.add(tuple((s.state.row, s.state.col) for s in steps))
  assert len(paths) > 1


def test_not_slippery_ignores_seed():
  env = make(fixed_map=OPEN5)
  paths = set()
  for seed in range(10):
    state, _ = env.reset(None, seed)
    steps = play(env, state, ["right", "down", "right"])
    paths.add(tuple((s.state.row, s.state.col) for s in steps))
  assert paths == {((0, 1), (1, 1), (1, 2))}


@pytest.mark.parametrize("vary", ["seed", "turn"])
@pytest.mark.parametrize("action", fl.ACTIONS)
def test_slippery_moves_intended_or_perpendicular_a_third_each(action, vary):
  env = make(slippery=True, fixed_map=OPEN5)
  a = fl.ACTIONS.index(action)
  dr, dc = fl.DELTAS[a]
  kinds = {(dr, dc): "intended", (-dr, -dc): "opposite", (dc, dr): "perp", (-dc, -dr): "perp"}
  counts = {"intended": 0, "perp": 0, "opposite": 0}
  n = 600
  for i in range(n):
    start = at(2, 2, OPEN5, seed=i) if vary == "seed" else at(2, 2, OPEN5, seed=7, turn=i)
    out = env.step(start, action).state
    counts[kinds[(out.row - 2, out.col - 2)]] += 1
  assert counts["opposite"] == 0
  assert abs(counts["intended"] / n - 1 / 3) < 0.07, counts
  assert abs(counts["perp"] / n - 2 / 3) < 0.07, counts


def test_slippery_perpendiculars_are_balanced():
  # From the center, "up" slips left or right: each about a third.
  env = make(slippery=True, fixed_map=OPEN5)
  cols = [env.step(at(2, 2, OPEN5, seed=s), "up").state.col for s in range(600)]
  assert abs(cols.count(1) / 600 - 1 / 3) < 0.07
  assert abs(cols.count(3) / 600 - 1 / 3) < 0.07


WORD_CASES = {
  "right": 2,
  "I go Right.": 2,
  "LEFT": 0,
  "Down!": 1,
  "up, definitely up": 3,
  "left or right": None,
  "leftover": None,
  "upward": None,
  "downright": None,
  "": None,
  "go north": None,
  "I thought about left. <answer>down</answer>": 1,
  "<ANSWER> Up </ANSWER> then left": 3,
  "<answer>left or up</answer>": None,
  "<answer>nothing</answer> right": None,  # the answer span alone counts
  "<answer>right": 2,  # no complete span: the whole text
}


@pytest.mark.parametrize("text", list(WORD_CASES))
def test_parse_action_word_style(text):
  assert fl.parse_action(text, "word") == WORD_CASES[text]


CHAR_CASES = {"R": 2, " r\n": 2, "l": 0, "D": 1, "U": 3, "RR": None, "X": None, "": None}
CHAR_CASES.update({"right": None, "R.": None})


@pytest.mark.parametrize("text", list(CHAR_CASES))
def test_parse_action_char_style(text):
  assert fl.parse_action(text, "char") == CHAR_CASES[text]


def test_parse_action_rejects_unknown_style():
  with pytest.raises(ValueError, match="style='words'"):
    fl.parse_action("left", "words")


@pytest.mark.parametrize("style", ["word", "char"])
def test_invalid_action_penalizes_and_keeps_state(style):
  env = make(style=style, invalid_penalty=0.25)
  state, _ = env.reset(None, 0)
  state = env.step(state, "right" if style == "word" else "R").state
  out = env.step(state, "jump")
  assert out.state == state._replace(turn=state.turn + 1)
  assert (out.reward, out.done) == (-0.25, False)
  assert out.info == {"success": False, "invalid_action": True}
  assert out.observation.startswith(fl.invalid_message(style))
  assert all(a in out.observation for a in (fl.ACTIONS if style == "word" else fl.CHARS))
  assert out.observation.endswith(fl.observation(out.state, style))
  assert "SPFF\nFHFH\nFFFH\nHFFG\n" in out.observation


def test_invalid_message_names_every_action():
  env = make()
  state, _ = env.reset(None, 0)
  out = env.step(state, "left or right")
  assert out.reward == -0.1
  assert all(word in out.observation for word in fl.ACTIONS)


def test_char_style_observation_is_the_board_and_a_short_position():
  env = make(style="char")
  state, _ = env.reset(None, 0)
  assert env.step(state, "D").observation == "SFFF\nPHFH\nFFFH\nHFFG\nAt 1,0."


def reachable(m):
  """Cells reachable from (0, 0) through non-hole cells, by depth-first search."""
  n = len(m)
  seen, stack = set(), [(0, 0)]
  while stack:
    r, c = stack.pop()
    if (r, c) in seen or not (0 <= r < n and 0 <= c < n) or m[r][c] == "H":
      continue
    seen.add((r, c))
    stack += [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]
  return seen


@pytest.mark.parametrize("size", [4, 5, 8])
def test_generated_maps_are_valid_and_solvable(size):
  for seed in range(51):
    m = fl.generate_map(size, seed)
    assert len(m) == size and all(len(r) == size for r in m)
    assert set("".join(m)) <= set("SFHG")
    flat = "".join(m)
    assert flat.count("S") == 1 and m[0][0] == "S"
    assert flat.count("G") == 1 and m[-1][-1] == "G"
    assert (size - 1, size - 1) in reachable(m), m
    fl.validate_map(m)


def test_generate_map_is_deterministic_and_seed_dependent():
  for seed in range(5):
    assert fl.generate_map(6, seed, 0.3) == fl.generate_map(6, seed, 0.3)
  assert len({fl.generate_map(6, seed, 0.3) for seed in range(5)}) > 1
  assert fl.generate_map(3, 0, 0.0) == ("SFF", "FFF", "FFG")


def test_generated_maps_have_holes_near_hole_prob():
  flat = "".join("".join(fl.generate_map(8, s, 0.2)[1:-1]) for s in range(30))
  assert 0.1 < flat.count("H") / len(flat) < 0.25


def test_reset_without_fixed_map_generates_from_seed():
  env = fl.make_env(size=5, hole_prob=0.3)
  state, _ = env.reset(None, 11)
  assert state.map == fl.generate_map(5, 11, 0.3)
  task_state, _ = env.reset(list(MAP4), 11)
  assert task_state.map == MAP4 and isinstance(task_state.map, tuple)


@pytest.mark.parametrize(
  "bad, match",
  [
    (("SFFS", "FFFG"), "exactly one 'S'"),
    (("SFF", "FFF"), "exactly one 'G'"),
    (("SFX", "FFG"), "unknown letters"),
    (("SFF", "FG"), "equal lengths"),
    ((), "non-empty"),
    ("SFFG", "tuple of strings"),
  ],
)
def test_validate_map_rejects_bad_maps(bad, match):
  with pytest.raises(ValueError, match=match):
    fl.validate_map(bad)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(size=1), "size=1"),
    (dict(hole_prob=1.0), "hole_prob=1.0"),
    (dict(max_turns=0), "max_turns=0"),
    (dict(style="letters"), "style='letters'"),
    (dict(invalid_penalty=-0.1), "invalid_penalty=-0.1"),
    (dict(hole_penalty=-1.0), "hole_penalty=-1.0 must be >= 0"),
    (dict(progress_reward=-0.1), "progress_reward=-0.1 must be >= 0"),
    (dict(progress_reward=True), "progress_reward=True must be a finite number"),
    (dict(edge_penalty=-0.1), "edge_penalty=-0.1 must be >= 0"),
    (dict(neighbours=1), "neighbours=1 must be True or False"),
    (dict(neighbours=True, style="char"), "neighbours=True with style='char'"),
    (dict(hole_penalty=float("nan")), "hole_penalty=nan must be a finite number"),
    (dict(slippery="yes"), "slippery='yes'"),
    (dict(fixed_map=("SF", "FF")), "exactly one 'G'"),
  ],
)
def test_make_env_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    fl.make_env(**kwargs)


def test_make_env_names_an_unknown_rule():
  with pytest.raises(TypeError, match="make_env got \\['holes'\\]; its rules are"):
    fl.make_env(holes=0.1)


def test_bad_seed_and_size_are_rejected():
  with pytest.raises(ValueError, match="seed=-1"):
    make().reset(None, -1)
  with pytest.raises(ValueError, match="size=1"):
    fl.generate_map(1, 0)
  with pytest.raises(ValueError, match="exactly one 'S'"):
    make().reset(("FFF", "FFG"), 0)


def test_step_returns_a_protocol_step():
  env = make()
  state, _ = env.reset(None, 0)
  out = env.step(state, "down")
  assert isinstance(out, Step) and isinstance(out.state, fl.State)
  assert out.state.map == MAP4 and fl.observation(out.state, "word") == out.observation


def test_map_blind_baselines_agree_with_the_envs_own_steps():
  """`experiments.frozenlake_baselines` plays every move sequence on every map at once;
  each sequence's outcome equals the env's own episode (`make_env` reset/step with the
  move words, stopping when done), and the report's figures are those outcomes' counts.

  Mutations caught: holes not ending the walk; a move off the grid wrapping or not stopping
  at the edge; the random figure as the best sequence's share."""
  import itertools

  import numpy as np

  fb = import_main("experiments.frozenlake_baselines")

  maps = [fl.generate_map(3, seed, 0.3) for seed in range(6)]
  turns = 5
  env = fl.make_env(size=3, hole_prob=0.3, max_turns=turns)
  sequences = list(itertools.product(range(4), repeat=turns))
  got = fb.successes(maps, np.array(sequences))
  want = np.zeros(got.shape, bool)
  for j, m in enumerate(maps):
    for i, seq in enumerate(sequences):
      state, _ = env.reset(m, 0)
      for a in seq:
        step = env.step(state, fl.ACTIONS[a])
        state = step.state
        if step.done:
          want[i, j] = step.info["success"]
          break
  np.testing.assert_array_equal(got, want)
  assert want.any() and not want.all()  # some walks win, some fall or run out of moves
  report = fb.baselines(maps, turns)
  assert report["random"] == pytest.approx(want.mean())
  assert report["best_fixed"]["solved"] == want.sum(axis=1).max()
  stairs = [1, 2] * 3  # down, right, ... in ACTIONS order
  assert (
    report["staircase_down_first"]["solved"] == want[sequences.index(tuple(stairs[:turns]))].sum()
  )
  with pytest.raises(ValueError, match="--turns=11"):
    fb.baselines(maps, 11)


def test_neighbour_reader_reads_the_line_and_walks_as_a_tile_level_reference():
  """`experiments.frozenlake_baselines`' neighbour reader: its parse of the env's neighbours
  line names every cell's neighbours as the map's tiles do; on a hand-made map it steps
  around the hole on the staircase (right, down, right, down, right, down); on generated
  maps its counts equal a reference written on the tiles (down/right in turn, then the
  other, left, up: the first inside the map and not a hole).

  Mutations caught: holes read as safe; the edge read as safe; the turn order not
  alternating (down every turn)."""
  fb = import_main("experiments.frozenlake_baselines")

  m = ("SFFF", "HFFF", "FHFF", "FFFG")
  for row in range(4):
    for col in range(4):
      state = fl.State(map=m, row=row, col=col, turn=0, seed=0, done=False)
      around = fb.read_neighbours(fl.observation(state, "word", neighbours=True))
      for (dr, dc), name in zip(fl.DELTAS, fl.ACTIONS):
        r, c = row + dr, col + dc
        inside = 0 <= r < 4 and 0 <= c < 4
        assert around[name] == (fl.TILE_WORDS[m[r][c]] if inside else "edge")
  env = fl.make_env(4, max_turns=8, neighbours=True)
  state, obs = env.reset(m, 0)
  moves, previous = [], None
  while not state.done:
    previous = fb.neighbour_reader_move(obs, previous)
    moves.append(previous)
    step = env.step(state, previous)
    state, obs = step.state, step.observation
  assert moves == ["right", "down", "right", "down", "right", "down"] and step.info["success"]

  def reference(tiles, turns=8):
    row, col, previous = 0, 0, None
    for _ in range(turns):
      first = 2 if previous == 1 else 1  # ACTIONS: left, down, right, up
      for a in (first, 3 - first, 0, 3):
        r, c = row + fl.DELTAS[a][0], col + fl.DELTAS[a][1]
        if 0 <= r < len(tiles) and 0 <= c < len(tiles) and tiles[r][c] != "H":
          break
      else:
        a = first
      r, c = row + fl.DELTAS[a][0], col + fl.DELTAS[a][1]
      if 0 <= r < len(tiles) and 0 <= c < len(tiles):
        row, col = r, c
      previous = a
      if tiles[row][col] in "HG":
        return "solved" if tiles[row][col] == "G" else "holes"
    return "truncated"

  maps = [fl.generate_map(4, seed, 0.3) for seed in range(40)]
  want = {"solved": 0, "holes": 0, "truncated": 0}
  for tiles in maps:
    want[reference(tiles)] += 1
  assert fb.neighbour_reader(maps, 8) == want
  assert want["solved"] and want["truncated"]  # both outcomes occur on these maps


def test_greedy_outcomes_replay_and_read_as_one_sequence_or_not():
  """`frozenlake_baselines.replayed_walks` replays a run's outcome record on the maps its
  seeds draw, and `map_reading` counts the walks one fixed sequence explains: a
  map-blind staircase is one sequence on every map (none solved off it); the neighbour
  reader is not, and solves maps off its commonest sequence; a record from other maps is
  refused, naming the flags.

  Mutations caught: the prefix test reversed; walks solved off the sequence never
  counted; the replay's outcome not compared (lengths only)."""
  import numpy as np

  fb = import_main("experiments.frozenlake_baselines")

  seeds = range(500, 540)
  env = fl.make_env(4, max_turns=8, neighbours=True)

  def record(policy):
    episodes = []
    for seed in seeds:
      state, obs = env.reset(None, seed)
      replies, previous, step = [], None, None
      while len(replies) < 8 and not state.done:
        previous = policy(obs, previous, len(replies))
        replies.append(f" {previous}\n")
        step = env.step(state, previous)
        state, obs = step.state, step.observation
      success = bool(step.info["success"])
      episodes.append(
        dict(seed=seed, reward=0.0, success=success, done=state.done, truncated=not state.done)
        | {"replies": replies}
      )
    return {"step": 3, "episodes": episodes}

  stairs = record(lambda obs, prev, t: ("down", "right")[t % 2])
  walks = fb.replayed_walks(stairs, 4, 0.2)
  blind = fb.map_reading(walks)
  assert blind["one_sequence"] == len(seeds) and blind["solved_off_sequence"] == 0
  assert blind["sequence"][:2] == ["down", "right"]
  maps = [fl.generate_map(4, s, 0.2) for s in seeds]
  solved = int(fb.successes(maps, np.array([[1, 2] * 4])).sum())
  assert blind["solved"] == solved and sum(blind[k] for k in ("solved", "holes", "truncated")) == 40
  reader = fb.map_reading(
    fb.replayed_walks(record(lambda o, p, t: fb.neighbour_reader_move(o, p)), 4, 0.2)
  )
  assert reader["one_sequence"] < len(seeds) and reader["solved_off_sequence"] > 0
  assert reader["solved"] > blind["solved"]
  with pytest.raises(ValueError, match="--hole_prob=0.5"):
    fb.replayed_walks(stairs, 4, 0.5)
  won = next(e for e in stairs["episodes"] if e["success"])
  won["success"] = False  # as if the walk had ended in a hole
  with pytest.raises(ValueError, match=f"seed {won['seed']}: .* success=True, but the run"):
    fb.replayed_walks(stairs, 4, 0.2)
