"""rlpost.envs.reasoning_gym against the package: items by seed, rewards = score_answer on
the extracted answer, held-out items disjoint by content, retries, bad input."""

import json
import math

import pytest
from optional_packages import require

from rlpost import errors
from rlpost.envs import held_out
from rlpost.envs import protocol
from rlpost.envs import reasoning_gym as rg_env
from rlpost.envs import table as env_table
from rlpost.recipes import item_outcomes

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _tasks(eval_tasks=8, **fields):
  require("reasoning_gym")
  config = rg_env.ReasoningGymConfig(**{"task_config": json.dumps(SMALL), "pool": 50, **fields})
  return config, rg_env.build(config, protocol.RunInfo(eval_tasks=eval_tasks))


def test_items_and_rewards_are_the_packages():
  """Training seed s is item s of the package's generator (seed env.seed); the reward of a
  reply is dataset.score_answer(the <answer> text, item), 0.0 without a span. Mutation
  caught: score_answer given the whole reply instead of the extracted span."""
  rg = require("reasoning_gym")
  config, tasks = _tasks(seed=3, pool=50)
  package = rg.create_dataset("chain_sum", seed=3, size=50, **SMALL)
  for s in (0, 7, 49):
    state = tasks.train_tasks([s])[0]
    assert state.item == package[s]
    _, prompt = tasks.env.reset(state, s)
    assert prompt.startswith(package[s]["question"]) and "<answer>" in prompt
    gold = package[s]["answer"]
    for reply in (f"so <answer>{gold}</answer>", f"<answer>{int(gold) + 1}</answer>", gold):
      got = tasks.env.step(state, reply)
      span = rg_env.checkers.extract_answer(reply)
      want = package.score_answer(span, package[s]) if span is not None else 0.0
      assert got.reward == want and got.done and got.info["success"] is (want == 1.0)
  assert tasks.env.step(state, f"the answer is {gold}").reward == 0.0


def test_the_cue_format_scores_the_replys_first_line():
  """answer_format="cue" (base models): the prompt ends with "Answer:", the reply stops at
  its first newline, and score_answer reads that line, stripped; an empty line is no
  answer (0.0, invalid_action). Mutation caught: the cue format scoring the whole reply."""
  rg = require("reasoning_gym")
  _, tasks = _tasks(seed=3, pool=50, answer_format="cue")
  package = rg.create_dataset("chain_sum", seed=3, size=50, **SMALL)
  state = tasks.train_tasks([5])[0]
  _, prompt = tasks.env.reset(state, 5)
  assert prompt.endswith("\nAnswer:") and tasks.env.stop_strings == ("\n",)
  gold = package[5]["answer"]
  right = tasks.env.step(state, f" {gold}\nmore text")
  assert right.reward == package.score_answer(gold, package[5]) == 1.0 and right.info["success"]
  empty = tasks.env.step(state, "  \n")
  assert empty.reward == 0.0 and empty.info["invalid_action"]
  assert right.info["answer"] == empty.info["answer"] == str(gold)  # the outcome files' answer
  with pytest.raises(ValueError, match="answer_format='xml'"):
    rg_env.ReasoningGymConfig(answer_format="xml")


def test_a_raising_scorer_scores_zero():
  """Never an exception: a score_answer that raises gives reward 0.0. Mutation caught: the
  try/except around the scorer removed."""

  class Raising:
    def score_answer(self, answer, item):
      return 1 / 0

  assert rg_env.score_here({"chain_sum": Raising()}, "chain_sum", "1", {"answer": "1"}) == 0.0


def test_held_out_items_are_disjoint_from_the_training_pool():
  """With a generator of few distinct questions (one-digit a + b), held-out items repeat
  training ones and each other unless skipped: the held-out set (`held_out.choose` over
  the environment's content key) has 20 distinct questions, none in the pool (questions
  recomputed here from the package's own stream), and its counts by seed alone are those
  of the stream's first 20 items. Mutation caught: content_key reading the answer instead
  of the question (repeats kept)."""
  rg = require("reasoning_gym")
  config, tasks = _tasks(eval_tasks=20, pool=100)
  held = held_out.choose(tasks, held_out.train_seeds(tasks, 1, 1), 10**6, 20)
  pool = {
    rg_env.normalise(x["question"])
    for x in rg.create_dataset("chain_sum", seed=0, size=100, **SMALL)
  }
  stream = rg.create_dataset("chain_sum", seed=10**6, size=10**5, **SMALL)
  chosen = [rg_env.normalise(stream[s - 10**6]["question"]) for s in held.seeds]
  assert len(set(chosen)) == 20 and not set(chosen) & pool
  first = [rg_env.normalise(stream[k]["question"]) for k in range(20)]
  assert held.overlap_before == sum(q in pool for q in first) > 0
  assert (held.overlap, held.distinct, held.distinct_before) == (0, 20, len(set(first)))
  assert [t.item for t in tasks.eval_tasks(list(held.seeds[:2]))] == [
    stream[s - 10**6] for s in held.seeds[:2]
  ]


def test_retries_answer_again_after_feedback_and_a_mixture_draws_both():
  """env.retries=1: a wrong answer is told so (reward 0, not done), the second answer ends
  the episode with its own reward. A mixture 'chain_sum:1,basic_arithmetic:1' draws both.
  Mutation caught: `new.attempts > config.retries` as `>=` (no retry)."""
  _, tasks = _tasks(task="chain_sum:1,basic_arithmetic:1", task_config="", retries=1)
  names = {s.name for s in tasks.train_tasks(list(range(40)))}
  assert names == {"chain_sum", "basic_arithmetic"} and tasks.env.max_turns == 2
  state = tasks.train_tasks([0])[0]
  first = tasks.env.step(state, "<answer>nope</answer>")
  assert not first.done and first.reward == 0.0 and "not correct" in first.observation
  second = tasks.env.step(first.state, f"<answer>{state.item['answer']}</answer>")
  assert second.done and second.reward == 1.0 and state.attempts == 0


@pytest.mark.parametrize(
  "fields,match",
  [
    ({"task": "no_such_task"}, r"config\.env\.task='no_such_task': is not a reasoning-gym"),
    ({"task_config": '{"min_terms": 0}'}, r"config\.env\.task_config=.*chain_sum refuses it"),
    ({"task_config": "{oops"}, r"config\.env\.task_config='\{oops': is not a JSON object"),
    ({"retries": -1}, r"config\.env\.retries=-1: must be an integer >= 0"),
    ({"checker": "regex"}, r"config\.env\.checker='regex': use one of"),
    ({"task": "chain_sum:inf"}, r"chain_sum's weight 'inf' is not a positive finite number"),
    ({"task": "chain_sum:0,basic_arithmetic"}, r"chain_sum's weight '0' is not a positive"),
    ({"task": ":2"}, r"config\.env\.task=':2': write a generator's name"),
  ],
)
def test_bad_fields_are_named(fields, match):
  require("reasoning_gym")
  with pytest.raises(errors.ConfigError, match=match):
    env_table.env_config({"name": "reasoning_gym", **fields})


def test_other_checkers_read_the_answer_span():
  """env.checker=exact accepts "<gold>.0" (numbers as numbers), math_verify accepts
  "\\boxed{<gold>}"; the package's score_answer is what decides by default. Mutation
  caught: `score` calling score_answer whatever the checker."""
  require("math_verify")
  for checker, reply in (("exact", "{}.0"), ("math_verify", "\\boxed{{{}}}")):
    _, tasks = _tasks(checker=checker)
    state = tasks.train_tasks([3])[0]
    text = f"<answer>{reply.format(state.item['answer'])}</answer>"
    assert tasks.env.step(state, text).reward == 1.0
    assert tasks.env.step(state, "<answer>x</answer>").reward == 0.0


def _number_format_run(tmp_path, picks):
  """A number_format run's folder: its config.json (the env and eval blocks the tool
  reads) and eval/step_0.jsonl replying to held-out item k its picks[k]-th number as the
  question writes it, recorded right when that candidate is the generator's solution."""
  from experiments import reasoning_gym_baselines as baselines  # pylint: disable=g-import-not-at-top

  rg = require("reasoning_gym")
  env = {"name": "reasoning_gym", "task": "number_format", "answer_format": "cue", "pool": 20}
  (tmp_path / "eval").mkdir(exist_ok=True)
  (tmp_path / "config.json").write_text(
    json.dumps({"env": env, "eval": {"seed_offset": 10**6, "num_tasks": len(picks)}})
  )
  stream = rg.create_dataset("number_format", seed=10**6, size=len(picks))
  rows = []
  for k, i in enumerate(picks):
    meta = stream[k]["metadata"]
    right = meta["candidates"][i] == meta["solution"]
    reply = f" {baselines.numbers(stream[k]['question'])[i]}\n"
    rows.append(item_outcomes.item(10**6 + k, None, float(right), right, 1, reply))
  (tmp_path / "eval" / "step_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return stream


def test_copying_yardsticks_agree_with_the_generators_candidates(tmp_path):
  """On number_format (pick the largest or smallest of 2-5 candidates written as digits,
  with commas or in scientific notation) the question's numbers are the generator's
  candidates (`metadata`), so copying the first / last one succeeds exactly where it is the
  solution and a random copy is expected to succeed 1/N of the time; a run replying the
  first candidate everywhere has every reply a first-number copy, one replying the last
  none, and a record that does not score as written is refused.
  Mutations caught: the last number taken for the first; the random expectation summing
  the wins instead of averaging them."""
  from experiments import reasoning_gym_baselines as baselines  # pylint: disable=g-import-not-at-top

  n = 40
  stream = _number_format_run(tmp_path, [0] * n)
  metas = [stream[k]["metadata"] for k in range(n)]
  for k, meta in enumerate(metas):
    written = [baselines.value(w) for w in baselines.numbers(stream[k]["question"])]
    assert len(written) == len(meta["candidates"])
    assert all(math.isclose(w, c) for w, c in zip(written, meta["candidates"]))
  wins = [[c == m["solution"] for c in m["candidates"]] for m in metas]
  got = baselines.report(str(tmp_path))
  assert got["yardsticks"] == {
    "first_number": sum(w[0] for w in wins),
    "last_number": sum(w[-1] for w in wins),
    "random_number": round(sum(sum(w) / len(w) for w in wins), 3),
  }
  assert 0 < sum(w[0] for w in wins) < n and all(sum(w) == 1 for w in wins)
  assert got["steps"]["0"] == {
    "items": n,
    "successes": sum(w[0] for w in wins),
    "copies": n,
    "first_number_copies": n,
    "last_number_copies": 0,
  }
  _number_format_run(tmp_path, [-1] * n)
  last = baselines.report(str(tmp_path))["steps"]["0"]
  assert (last["first_number_copies"], last["last_number_copies"]) == (0, n)
  lines = (tmp_path / "eval" / "step_0.jsonl").read_text().splitlines()
  row = json.loads(lines[0])
  row["success"], row["reward"] = not row["success"], 1.0 - row["reward"]
  (tmp_path / "eval" / "step_0.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
  with pytest.raises(ValueError, match="item 1000000: the recorded reply"):
    baselines.report(str(tmp_path))
  with pytest.raises(ValueError, match="no config.json there"):
    baselines.report(str(tmp_path / "eval"))


# a wrong reply each broken scorer gives full credit
_HACKS = {"game_of_life_halting": "not an answer", "coin_flip": "0"}


@pytest.mark.parametrize("name", sorted(rg_env.BROKEN_SCORERS))
def test_broken_scorers_are_refused_unless_another_checker_decides(name):
  """The package's score_answer of BROKEN_SCORERS' generators gives 1.0 to a wrong reply on
  every item (when a release fixes one, this fails: drop its entry); such a task is refused
  with checker=score_answer, naming the fix, and with checker=exact the reply scores 0.
  Mutation caught: the refusal's condition dropped."""
  rg = require("reasoning_gym")
  assert set(_HACKS) == set(rg_env.BROKEN_SCORERS)
  package = rg.create_dataset(name, seed=0, size=8)
  # coin_flip's "0" gets no credit for a probability of 1, the one it does not hack
  items = [package[i] for i in range(8) if str(package[i]["answer"]) not in (_HACKS[name], "1")]
  assert len(items) >= 4 and all(package.score_answer(_HACKS[name], x) == 1.0 for x in items)
  with pytest.raises(errors.ConfigError, match=rf"config\.env\.task='{name}': its score_answer"):
    env_table.env_config({"name": "reasoning_gym", "task": name})
  tasks = rg_env.build(rg_env.ReasoningGymConfig(task=name, checker="exact", pool=8), _RUN)
  states = tasks.train_tasks(list(range(8)))
  for state in states:
    hack = tasks.env.step(state, f"<answer>{_HACKS[name]}</answer>")
    right = tasks.env.step(state, f"<answer>{state.item['answer']}</answer>")
    assert right.reward == 1.0 and hack.reward == 0.0


def test_tasks_without_a_reference_answer_need_score_answer():
  """graph_color's items have no answer (any proper colouring is right): exact or
  math_verify would score every reply 0, so they are refused, naming the checker; its own
  score_answer is accepted. Mutation caught: the reference-free check dropped."""
  require("reasoning_gym")
  with pytest.raises(errors.ConfigError, match=r"config\.env\.checker='exact': graph_color's"):
    env_table.env_config({"name": "reasoning_gym", "task": "graph_color", "checker": "exact"})
  assert rg_env.ReasoningGymConfig(task="graph_color", pool=4).checker == "score_answer"


def test_a_generator_with_an_item_limit_caps_the_pool_and_the_held_out_stream():
  """word_ladder refuses more than MAX_ITEMS items (its config's own limit, checked here on
  the package): a larger pool is refused naming env.pool, and the held-out stream is cut to
  the limit, so the task builds and evaluates. Mutation caught: the held-out size left
  uncapped (the package refuses it)."""
  rg = require("reasoning_gym")
  limit = rg_env.MAX_ITEMS["word_ladder"]
  rg.create_dataset("word_ladder", seed=0, size=limit)
  with pytest.raises(ValueError, match="too large"):
    rg.create_dataset("word_ladder", seed=0, size=limit + 1)
  with pytest.raises(errors.ConfigError, match=rf"config\.env\.pool={limit + 1}: word_ladder"):
    env_table.env_config({"name": "reasoning_gym", "task": "word_ladder", "pool": limit + 1})
  tasks = rg_env.build(rg_env.ReasoningGymConfig(task="word_ladder", pool=8), _RUN)
  held = held_out.choose(tasks, range(8), _RUN.eval_seed_offset, 3)
  assert held.distinct == 3 and len(tasks.eval_tasks(list(held.seeds))) == 3


_RUN = protocol.RunInfo(eval_tasks=3)


@pytest.mark.slow
def test_every_offline_generator_builds_and_scores_its_own_answer():
  """Every generator in the package (its defaults) is an environment: it builds with its
  held-out stream, its prompt holds the question, the reference answer in <answer> tags
  scores 1.0 (by `exact` where score_answer is broken), a reply without tags scores 0 as an
  invalid action, a wrong one below 1; items without a reference answer (several replies
  right) are scored by their score_answer. Mutation caught: MAX_ITEMS emptied (word_ladder
  refuses the held-out stream's size). About 45 s (slow tier): 105 generators built, acre
  alone 26 s; "any generator by name" is only shown by building each."""
  rg = require("reasoning_gym")
  for name in sorted(set(rg.factory.DATASETS) - {"composite"}):
    checker = "exact" if name in rg_env.BROKEN_SCORERS else "score_answer"
    tasks = rg_env.build(rg_env.ReasoningGymConfig(task=name, pool=4, checker=checker), _RUN)
    assert len(tasks.eval_tasks([_RUN.eval_seed_offset + k for k in range(2)])) == 2, name
    for state in tasks.train_tasks([0, 1]):
      _, prompt = tasks.env.reset(state, 0)
      assert prompt.startswith(state.item["question"]), name
      untagged = tasks.env.step(state, "no tags here")
      assert untagged.reward == 0.0 and untagged.info["invalid_action"], name
      assert tasks.env.step(state, "<answer>zq xv wk</answer>").reward < 1.0, name
      if state.item["answer"] is not None:
        gold = tasks.env.step(state, f"<answer>{state.item['answer']}</answer>")
        assert gold.reward == 1.0, (name, state.item["answer"])
