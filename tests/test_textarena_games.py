"""rlpost.envs.textarena_games against textarena: our steps are the game's own steps with
the same seed and moves, Python's `random` is left as it was, the scripted opponent plays
legal moves reproducibly, refused games are named."""

import random

import ml_collections
import numpy as np
import pytest
from absl import flags
from conftest import REPO_ROOT, import_main, require_gemma3
from ml_collections import config_flags
from optional_packages import require

from rlpost import errors
from rlpost.envs import protocol
from rlpost.models import loading
from rlpost.recipes import rl
from rlpost.text import scaffold
from rlpost.envs import table as env_table
from rlpost.envs import textarena_games as tg


def _env(game, max_turns=12):
  require("textarena")
  return tg.build(tg.TextArenaConfig(game=game, max_turns=max_turns), protocol.RunInfo()).env


@pytest.mark.parametrize("game,moves", [
  ("GuessTheNumber-v0", ["[10]", "[5]", "[15]", "[3]", "[18]", "[1]", "[20]", "[12]"]),
  ("TowerOfHanoi-v0", ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]),
  ("Blackjack-v0", ["[hit]", "[stand]"] + ["[stand]"] * 8),  # draws cards in its steps
])  # fmt: skip
def test_steps_are_the_games_own(game, moves):
  """The game's raw env reset with the same seed and given the same moves (in place, its
  `random` stream undisturbed between its calls) shows the same messages, ends at the same
  move with the same reward; the caller's `random` state is untouched by ours. Mutation
  caught: `_call` not setting the episode's `random` state (Blackjack's cards then come
  from whatever state `random` is in)."""
  ta = require("textarena")
  env = _env(game)
  random.seed(99)
  outside = random.getstate()
  state, first = env.reset(None, 5)
  random.seed(12345)  # something else draws in between
  theirs = ta.make(f"{game}-raw")
  theirs.reset(num_players=1, seed=5)
  stream = random.getstate()  # textarena's own, as if nothing else ran
  assert first == tg._text(theirs.get_observation()[1])
  for move in moves:
    random.seed(777)
    step = env.step(state, move)
    random.setstate(stream)
    done, _ = theirs.step(move)
    stream = random.getstate()
    assert step.done == done
    if done:
      assert step.reward == theirs.state.rewards[0]
      break
    assert step.observation == tg._text(theirs.get_observation()[1])
    assert env.step(state, move).observation == step.observation  # state not changed
    state = step.state
  assert done, "the moves should finish the game"
  random.seed(99)
  assert random.getstate() == outside


@pytest.mark.parametrize("game", tg.TWO_PLAYER)
def test_two_player_opponent_is_legal_and_reproducible(game):
  """Against the scripted opponent, with our side playing random legal moves: every game
  ends within 40 moves with a reward in {-1, 0, 1}, not by the opponent's invalid move, and the same seed and moves replay the same game; a move off the
  board is flagged invalid_action. Mutation caught: `_valid` always True (no invalid move
  flagged)."""
  env = _env(game, max_turns=40)
  state, _ = env.reset(None, 0)
  assert env.step(state, "[99 99]").info["invalid_action"]

  def play(seed):
    state, text = env.reset(None, seed)
    rng, texts = np.random.default_rng(seed), [text]
    for _ in range(40):
      moves = tg._candidates(game, state.game, text)
      step = env.step(state, moves[rng.integers(len(moves))])
      texts.append(step.observation)
      if step.done:
        assert not step.state.game.state.game_info[1].get("invalid_move"), texts
        return step.reward, texts
      state, text = step.state, step.observation
    raise AssertionError(f"{game} did not end in 40 moves")

  for seed in (0, 1, 2):
    reward, texts = play(seed)
    assert reward in (-1.0, 0.0, 1.0) and (reward, texts) == play(seed)


@pytest.mark.parametrize(
  "game,match",
  [
    ("Wordle-v0", r"config\.env\.game='Wordle-v0': refused, it downloads nltk's 'words'"),
    ("Hangman-v0-hardcore", r"refused, it downloads"),
    ("TwentyQuestions-v0", r"needs a hosted judge"),
    ("Chess-v0", r"does not import on Python 3\.11"),
    ("NoSuchGame-v0", r"config\.env\.game='NoSuchGame-v0': use one of"),
  ],
)
def test_refused_games_are_named(game, match):
  require("textarena")
  with pytest.raises(errors.ConfigError, match=match):
    env_table.env_config({"name": "textarena", "game": game})


def test_cue_ends_every_observation_the_policy_reads():
  """With `cue`, the first observation and every later one (but the game's end, which the
  policy never reads) are the cue-less env's text, a newline and the cue; a cue that is not
  a string is refused by name. Mutation caught: the cue left off later turns."""
  require("textarena")
  plain = _env("TicTacToe-v0")
  cued = tg.build(
    tg.TextArenaConfig(game="TicTacToe-v0", max_turns=12, cue="Your move:"), protocol.RunInfo()
  ).env
  (state, text), (cstate, ctext) = plain.reset(None, 3), cued.reset(None, 3)
  assert ctext == text + "\nYour move:"
  for move in ("[4]", "[x]", "[0]", "[8]", "[6]", "[2]", "[1]", "[3]", "[5]", "[7]"):
    step, cstep = plain.step(state, move), cued.step(cstate, move)
    assert (cstep.reward, cstep.done, cstep.info) == (step.reward, step.done, step.info)
    if step.done:
      assert cstep.observation == step.observation == ""
      break
    assert cstep.observation == step.observation + "\nYour move:"
    state, cstate = step.state, cstep.state
  assert step.done
  with pytest.raises(errors.ConfigError, match=r"cue=3: must be a string"):
    env_table.env_config({"name": "textarena", "game": "TicTacToe-v0", "cue": 3})


def test_tictactoe_run_fits_its_longest_game():
  """The real-model TicTacToe config: a valid config whose game of `env.max_turns` moves
  (random legal ones against the opponent), each turn `rollout.max_turn_tokens` sampled
  tokens and the observation after it, fits the completion window in Gemma's tokens, and
  its first observation the prompt limit. Mutation caught: the window of 448 slots that
  the FrozenLake runs use."""
  require("textarena")
  require_gemma3()
  values = flags.FlagValues()
  spec = f"{REPO_ROOT}/experiments/configs/agentic_runs/textarena_gemma3.py:grpo"
  config_flags.DEFINE_config_file("config", spec, "", flag_values=values)
  values(["prog"])
  cfg: ml_collections.ConfigDict = values["config"].value
  env = rl.make_env(rl.check_config(cfg)).env
  tok = loading.load_gguf_tokenizer()
  longest = 0
  for seed in range(8):
    state, text = env.reset(None, seed)
    assert len(scaffold.text_ids(tok, text)) <= cfg.rollout.max_prompt_tokens
    rng, used = np.random.default_rng(seed), 0
    for _ in range(cfg.env.max_turns):
      moves = tg._candidates(cfg.env.game, state.game, text)
      step = env.step(state, moves[rng.integers(len(moves))])
      used += cfg.rollout.max_turn_tokens + len(scaffold.text_ids(tok, "\n" + step.observation))
      if step.done:
        break
      state, text = step.state, step.observation
    longest = max(longest, used)
  assert longest <= cfg.rollout.max_total_tokens, longest


ASKED = []


def lowest_free_cell(observation: str, seed: int, turn: int) -> str:
  """A user's TicTacToe opponent (`env.opponent`): the lowest free cell, in words around
  the move as a model would write it; records what it was asked."""
  ASKED.append((observation, seed, turn))
  return f"I take {tg.listed_moves(observation)[0]} now"


def passing(observation: str, seed: int, turn: int) -> str:
  """An opponent whose replies the game always refuses."""
  del observation, seed, turn
  return "I pass"


def _board(state) -> list[str]:
  return sum(state.game.state.game_state["board"], [])


def test_a_users_opponent_plays_player_one():
  """`env.opponent="MODULE:FUNCTION"`: after each of our moves player 1's mark is on the
  lowest free cell (read from the game's board), the function was asked with player 1's
  cued observation, the seed and the game's turn, none fell back; an opponent whose replies
  the game refuses is replaced by the random opponent's move (the boards equal the
  "random" env's on the same seed and moves) and each refusal is counted. Bad names,
  single-player games and a reply that is not text are refused by name. Mutations caught:
  opponent_reply_ignored; opponent_fallback_uncounted."""
  require("textarena")
  spec = "test_textarena_games:{}"
  make = lambda opponent: tg.make_env(
    tg.TextArenaConfig("TicTacToe-v0", 5, cue="Your move:", opponent=opponent)
  )
  env, refused = make(spec.format("lowest_free_cell")), make(spec.format("passing"))
  scripted = make("random")
  for seed in (0, 1):
    ASKED.clear()
    state, _ = env.reset(None, seed)
    for move in ("[4]", "[8]", "[2]", "[6]", "[1]"):
      before = _board(state)
      step = env.step(state, move)
      after = _board(step.state)
      ours = int(move[1:-1])
      placed = [i for i in range(9) if before[i] == "" and after[i] != "" and i != ours]
      free = [i for i in range(9) if before[i] == "" and i != ours]
      assert placed in ([], [free[0]]) if step.done else placed == [free[0]]
      assert step.info["opponent_fallbacks"] == 0
      state = step.state
      if step.done:
        break
    observation, asked_seed, turn = ASKED[0]
    assert observation.endswith("\nYour move:") and "Available Moves:" in observation
    assert asked_seed == seed and [a[2] for a in ASKED] == [1 + 2 * k for k in range(len(ASKED))]
    (r_state, _), (s_state, _) = refused.reset(None, seed), scripted.reset(None, seed)
    for move in ("[4]", "[0]", "[8]"):
      r_step, s_step = refused.step(r_state, move), scripted.step(s_state, move)
      assert _board(r_step.state) == _board(s_step.state)
      assert r_step.info["opponent_fallbacks"] == (0 if r_step.done else 1)
      if r_step.done:
        break
      r_state, s_state = r_step.state, s_step.state
  bad = [
    ("nomodule", r"opponent='nomodule': write it as MODULE:FUNCTION naming fn\(observation"),
    ("json:no_such", r"opponent='json:no_such': cannot import it \(module 'json' has no"),
    ("json:__doc__", r"opponent='json:__doc__': not a function"),
  ]
  for opponent, match in bad:
    with pytest.raises(errors.ConfigError, match=match):
      env_table.env_config({"name": "textarena", "game": "TicTacToe-v0", "opponent": opponent})
  with pytest.raises(errors.ConfigError, match="TowerOfHanoi-v0 is single-player"):
    env_table.env_config({"name": "textarena", "game": "TowerOfHanoi-v0", "opponent": "json:dumps"})
  not_text = make("json:loads")  # json.loads("...observation...") raises: not a reply
  with pytest.raises((TypeError, ValueError)):
    not_text.step(not_text.reset(None, 0)[0], "[4]")


def test_scripted_baselines_agree_with_a_board_level_reference():
  """`experiments.textarena_baselines` on TicTacToe: `first_listed` plays the lowest free
  cell (a reference reading the game's board, not the observation's move list), its
  counts are those games' outcomes (draws apart from losses), and no listed move is ever
  invalid. Mutations caught: the last listed move; draws counted as losses."""
  require("textarena")
  tb = import_main("experiments.textarena_baselines")
  seeds = range(40)
  env = tg.make_env(tg.TextArenaConfig(game="TicTacToe-v0", max_turns=5))
  want = {"won": 0, "drawn": 0, "lost": 0, "cut": 0}
  for seed in seeds:
    state, _ = env.reset(None, seed)
    for _ in range(5):
      board = sum(state.game.state.game_state["board"], [])
      step = env.step(state, f"[{board.index('')}]")
      state = step.state
      if step.done:
        kind = "won" if step.info["success"] else "drawn" if step.reward == 0 else "lost"
        want[kind] += 1
        break
    else:
      want["cut"] += 1
  report = tb.baselines("TicTacToe-v0", 5, seeds, random_draws=2)
  assert report["first_listed"] == {**want, "invalid_moves": 0}
  assert want["won"] and want["lost"] and want["drawn"]  # every outcome occurs on these seeds
  rand = report["random_listed"]
  assert rand["invalid_moves"] == 0 and rand["draws"] == 2
  assert sum(rand[k] for k in ("won", "drawn", "lost", "cut")) == len(seeds)
  with pytest.raises(ValueError, match="--random_draws=0"):
    tb.baselines("TicTacToe-v0", 5, seeds, random_draws=0)


def test_a_runs_greedy_games_replay_and_compare_with_the_first_listed_move():
  """`textarena_baselines.replayed` replays an evaluation record (replies as a model writes
  them) through reset/step: the first-listed policy's record counts every game as
  first-listed, a random one's fewer; a record whose outcome was tampered with is refused,
  naming the seed. Mutation caught: the replay's outcome not compared."""
  require("textarena")
  tb = import_main("experiments.textarena_baselines")
  env = tg.make_env(tg.TextArenaConfig(game="TicTacToe-v0", max_turns=5))

  def record(choose):
    episodes = []
    for seed in range(100, 120):
      game = tb.play(env, seed, choose, 5)
      replies = [f" '{m}' is the first\n" for m in game["moves"]]
      episodes.append({"seed": seed, "success": game["outcome"] == "won", "replies": replies})
    return {"step": 20, "episodes": episodes}

  first = record(tb.first_listed)
  got = tb.replayed(first, env, 5)
  assert got["first_listed_games"] == 20 and got["invalid_moves"] == 0
  assert {k: got[k] for k in ("won", "drawn", "lost", "cut")} == {
    k: v for k, v in tb.baselines("TicTacToe-v0", 5, range(100, 120), 1)["first_listed"].items()
    if k != "invalid_moves"
  }  # fmt: skip
  last = record(lambda observation, turn: tb.listed_moves(observation)[-1])
  assert tb.replayed(last, env, 5)["first_listed_games"] < 20
  won = next(e for e in first["episodes"] if e["success"])
  won["success"] = False
  with pytest.raises(ValueError, match=f"seed {won['seed']}: .* but the run recorded"):
    tb.replayed(first, env, 5)


@pytest.mark.slow
def test_the_endpoint_opponent_plays_the_served_models_replies(monkeypatch):
  """`experiments/examples/endpoint_opponent.py` against `experiments.serve`'s endpoint on
  the tiny model (127.0.0.1): every opponent move is one request whose prompt is player 1's
  cued observation and whose sampled text the example returns (the server's session
  recorder, decoded); the tiny model's replies name no legal move, so each falls back to
  the random move and is counted; the same seed replays the same game (seeded requests at
  temperature 1). Mutation caught: opponent_fallback_uncounted."""
  require("textarena")
  openai_client = require("openai")
  del openai_client
  from experiments.examples import endpoint_opponent  # pylint: disable=g-import-not-at-top
  from rlpost.serve import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from rlpost.serve import scheduler, server, sessions  # pylint: disable=g-import-not-at-top

  config, params, tok = loading.load_model("tiny", "random")
  engine = engine_lib.Engine(params, config, tok, "tiny", 1024, 8)
  settings = server.ServerConfig(port=0, max_concurrent=2)
  replies = []
  real_move = endpoint_opponent.move
  monkeypatch.setattr(
    endpoint_opponent, "move", lambda *a: replies.append(real_move(*a)) or replies[-1]
  )
  env = tg.make_env(  # made after the patch: the env resolves the function once
    tg.TextArenaConfig(
      "TicTacToe-v0", 5, cue="Your move:", opponent="experiments.examples.endpoint_opponent:move"
    )
  )
  with server.serve_in_thread(engine, settings, scheduler.BatchConfig(4, 20.0)) as endpoint:
    monkeypatch.setenv("RLPOST_OPPONENT_URL", endpoint.session_url("opponent"))

    def game(seed):
      state, text = env.reset(None, seed)
      boards, fallbacks = [], 0
      for move in ("[4]", "[0]", "[8]", "[2]", "[6]"):
        step = env.step(state, move)
        boards.append(_board(step.state))
        fallbacks += step.info["opponent_fallbacks"]
        if step.done:
          break
        state, text = step.state, step.observation
      return boards, fallbacks

    replies.clear()
    boards, fallbacks = game(3)
    turns = sessions.take(endpoint.recorder, "opponent")
    assert len(turns) == len(replies) == fallbacks > 0
    for turn, reply in zip(turns, replies):
      assert tok.decode(list(turn.sampled)) == reply
      prompt = tok.decode(list(turn.prompt))
      assert prompt.endswith("Your move:") and "Available Moves:" in prompt
    assert game(3) == (boards, fallbacks)
