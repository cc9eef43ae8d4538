"""rlpost.envs.toy_text against gymnasium: a step of ours is a step of gymnasium's (same
seed, same actions, slippery included), states are never changed, text views, bad input."""

import json

import pytest
from hypothesis import given, settings, strategies as st
from optional_packages import require

from rlpost import errors
from rlpost.envs import held_out, protocol
from rlpost.envs import table as env_table
from rlpost.envs import toy_text

CASES = [
  ("FrozenLake-v1", '{"is_slippery": true}'),
  ("FrozenLake8x8-v1", '{"is_slippery": false}'),
  ("Taxi-v4", '{"is_rainy": true}'),
  ("CliffWalkingSlippery-v1", ""),
  ("Blackjack-v1", '{"natural": true, "sab": false}'),
]
_ENVS = {}


def _env(id_, kwargs):
  require("gymnasium")
  if (id_, kwargs) not in _ENVS:
    config = toy_text.GymConfig(id=id_, kwargs=kwargs, max_turns=60)
    _ENVS[id_, kwargs] = toy_text.build(config, protocol.RunInfo()).env
  return _ENVS[id_, kwargs]


@settings(max_examples=40, deadline=None)
@given(
  case=st.sampled_from(CASES),
  seed=st.integers(0, 2**31 - 1),
  actions=st.lists(st.integers(0, 5), min_size=1, max_size=25),
)
def test_a_step_is_gymnasiums_step(case, seed, actions):
  """Ours and gymnasium's own env (gymnasium.make, reset with the seed, stepped in place)
  agree on every observation, reward and termination; stepping a state again gives the
  same step and leaves it unchanged (the restored random generator). Mutation caught:
  `restore` not setting the generator's state (slippery moves then differ)."""
  gym = require("gymnasium")
  env = _env(*case)
  theirs = gym.make(case[0], **json.loads(case[1] or "{}")).unwrapped
  obs, _ = theirs.reset(seed=seed)
  state, _ = env.reset(None, seed)
  assert state.obs == obs
  words = toy_text.views.VIEWS[type(theirs).__name__].actions
  for a in actions:
    a %= len(words)
    obs, reward, terminated, _, _ = theirs.step(a)
    before = state
    step = env.step(state, f"I choose {words[a]}.")
    assert (step.state.obs, step.reward, step.done) == (obs, float(reward), terminated)
    assert env.step(before, words[a]) == step and state == before
    state = step.state
    if terminated:
      break


def test_random_maps_are_gymnasiums_and_the_view_marks_the_agent():
  """random_map_size=5: seed s plays gymnasium's generate_random_map(5, p, s), the view
  shows the map with P on the agent's cell; held-out maps are none of 200 training seeds'
  and distinct. Mutation caught: the view's `divmod(s, ncol)` as `divmod(s, nrow)` on a
  5x4 map would misplace P (checked on a non-square map); no `content_key` (held-out by
  seed: overlap unknown)."""
  gym = require("gymnasium")
  generate = gym.envs.toy_text.frozen_lake.generate_random_map
  config = toy_text.GymConfig(random_map_size=5, random_map_p=0.7)
  tasks = toy_text.build(config, protocol.RunInfo())
  (m,) = tasks.train_tasks([11])
  assert list(m) == generate(5, 0.7, 11)
  state, text = tasks.env.reset(m, 11)
  step = tasks.env.step(state, "right")
  if not step.done:
    r, c = divmod(step.state.obs, 5)
    assert step.observation.splitlines()[r][c] == "P"
  held = held_out.choose(tasks, range(200), 1_000_000, 30)
  trained = {tuple(generate(5, 0.7, s)) for s in range(200)}
  maps = {tuple(generate(5, 0.7, s)) for s in held.seeds}
  assert (held.overlap, held.distinct) == (0, 30) and len(maps) == 30 and not maps & trained
  wide = ("SFFH", "FFFF", "HFFF", "FFFF", "FFFG")
  env = toy_text.make_env(
    toy_text.GymConfig(kwargs=json.dumps({"desc": list(wide), "is_slippery": False}))
  )
  state, _ = env.reset(None, 0)
  step = env.step(state, "down")
  assert step.observation.splitlines()[1] == "PFFF"


def test_an_unparsed_reply_costs_the_penalty_and_keeps_the_position():
  """Mutation caught: the invalid branch stepping gymnasium anyway."""
  env = _env("Taxi-v4", '{"is_rainy": true}')
  state, first = env.reset(None, 3)
  assert "T" in first and "Moves: south, north, east, west, pickup, dropoff." in first
  step = env.step(state, "north or south")
  assert step.reward == -0.1 and step.info["invalid_action"] and step.state.obs == state.obs


@pytest.mark.parametrize(
  "fields,match",
  [
    ({"id": "Taxi-v3"}, r"config\.env\.id='Taxi-v3'.*use Taxi-v4"),
    ({"kwargs": '{"slippery": true}'}, r"config\.env\.kwargs=.*FrozenLake-v1 refuses them"),
    ({"random_map_size": 4, "id": "Taxi-v4"}, r"config\.env\.random_map_size=4: only FrozenLake"),
    ({"max_turns": 0}, r"config\.env\.max_turns=0: must be an integer >= 1"),
    # gymnasium builds these without a word and then plays nonsense
    ({"kwargs": '{"map_name": "9x9"}'}, r"kwargs=.*refuses them \(KeyError: '9x9'\)"),
    ({"kwargs": '{"desc": ["FF", "FG"]}'}, r"needs an 'S', a 'G'.*found 0 'S', 1 'G'\)"),
    ({"kwargs": '{"desc": ["SF", "FF"]}'}, r"needs an 'S', a 'G'.*found 1 'S', 0 'G'\)"),
    ({"kwargs": '{"desc": ["SFX", "FFG"]}'}, r"only the letters S F H G .*letters \['X'\]"),
    (
      {"kwargs": '{"is_slippery": true, "success_rate": 2}'},
      r"state 0, action 0 are \[-0\.5, 2\.0, -0\.5\], not a distribution",
    ),
  ],
)
def test_bad_fields_are_named(fields, match):
  require("gymnasium")
  with pytest.raises(errors.ConfigError, match=match):
    env_table.env_config({"name": "gymnasium", **fields})


@pytest.mark.parametrize("id_", toy_text.IDS)
def test_every_default_table_is_sound_and_a_two_start_map_is_gymnasiums(id_):
  """The check passes every id's own tables (and a map with two 'S', whose start
  gymnasium draws among them), so it refuses only what gymnasium mis-builds."""
  require("gymnasium")
  assert toy_text.table_problem(toy_text.make_gym(toy_text.GymConfig(id=id_), None), id_) is None
  config = toy_text.GymConfig(kwargs='{"desc": ["SFS", "FHG"], "is_slippery": true}')
  assert toy_text.table_problem(toy_text.make_gym(config, None), config.id) is None
