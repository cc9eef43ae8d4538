"""rlpost.envs.held_out: evaluation sets disjoint by content from training, and the
content keys of FrozenLake and the prompt datasets."""

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.envs import frozenlake, held_out, prompt_dataset, protocol

OFFSET = 1_000_000


def _lake(size=4, hole_prob=0.2, fixed_map=""):
  config = frozenlake.FrozenLakeConfig(size=size, hole_prob=hole_prob, fixed_map=fixed_map)
  return frozenlake.build(config, protocol.RunInfo())


@settings(max_examples=15, deadline=None)
@given(
  steps=st.integers(1, 40),
  batch=st.integers(1, 16),
  n=st.integers(1, 30),
  size=st.sampled_from([4, 5]),
)
def test_no_held_out_map_is_a_training_map_or_repeats(steps, batch, n, size):
  """Maps recomputed from the seeds (generate_map, not the key function): no held-out map
  is one a training seed draws, no two are equal, and the same call chooses the same set.
  Mutation caught: `choose` keeping a seed whose key is a training key (`key not in
  train_keys` dropped from its condition), or one seen before (`key not in seen` dropped)."""
  tasks = _lake(size)
  train = held_out.train_seeds(tasks, steps, batch)
  assert list(train) == list(range(steps * batch))
  held = held_out.choose(tasks, train, OFFSET, n)
  trained = {frozenlake.generate_map(size, s, 0.2) for s in train}
  maps = [frozenlake.generate_map(size, s, 0.2) for s in held.seeds]
  assert len(maps) == n and not set(maps) & trained and len(set(maps)) == n
  assert min(held.seeds) >= OFFSET and list(held.seeds) == sorted(held.seeds)
  assert held == held_out.choose(tasks, train, OFFSET, n)
  assert (held.overlap, held.distinct) == (0, n)
  assert held.keys == tuple(held_out.key_digest(m) for m in maps)


def test_counts_before_exclusion_are_the_seed_held_out_sets():
  """overlap_before / distinct_before describe the first n seeds, counted here from the
  maps directly; held-out seeds skipped are exactly those whose map was trained on or
  repeats. Mutation caught: overlap_before counting every draw instead of the first n."""
  tasks, n = _lake(4), 100
  train = held_out.train_seeds(tasks, 30, 16)  # 480 episodes (PPO: 16 tasks x 1)
  held = held_out.choose(tasks, train, OFFSET, n)
  trained = {frozenlake.generate_map(4, s, 0.2) for s in train}
  first = [frozenlake.generate_map(4, OFFSET + k, 0.2) for k in range(n)]
  assert held.overlap_before == sum(m in trained for m in first) > 0
  assert held.distinct_before == len(set(first)) < n
  seen, kept = set(), []
  for seed in range(OFFSET, OFFSET + held.draws):
    m = frozenlake.generate_map(4, seed, 0.2)
    if m not in trained and m not in seen:
      kept.append(seed)
    seen.add(m)
  assert tuple(kept) == held.seeds and held.draws > n
  metrics = held.metrics()
  assert metrics["eval/overlap"] == 0 and metrics["eval/distinct"] == n
  assert "none trained on" in held.describe("frozenlake")


def test_without_a_content_key_the_seeds_are_kept_and_overlap_is_unknown():
  """A fixed map names no content key (every episode plays it); an environment without
  one keeps seeds offset .. offset + n - 1 and reports no overlap figures."""
  tasks = _lake(fixed_map="SF,HG")
  assert tasks.content_key is None
  held = held_out.choose(tasks, range(10), OFFSET, 3)
  assert held.seeds == (OFFSET, OFFSET + 1, OFFSET + 2) and held.keys == (None,) * 3
  assert held.metrics() == {"eval/draws": 0}
  assert "unknown" in held.describe("frozenlake")


def test_too_few_unseen_items_is_an_error_naming_eval_num_tasks():
  """2x2 maps: S, G and two cells, three maps with a path, all of them trained on."""
  tasks = _lake(2, hole_prob=0.5)
  with pytest.raises(ValueError, match=r"config\.eval\.num_tasks=5: only 0 held-out items"):
    held_out.choose(tasks, range(200), OFFSET, 5, max_draws=2000)


def test_dataset_held_out_problems_differ_from_the_pool_by_normalised_question():
  """A prompt dataset's key is the normalised question: a held-out problem that is a
  training problem with other case and spacing is skipped, as is a repeat."""
  Problem = types.SimpleNamespace
  pool = [Problem(question=q) for q in ("How many apples?", "What is 3 + 4?")]
  held = [
    Problem(question=q)
    for q in ("how  many\tApples? ", "What is 30 + 4?", "WHAT IS 30 + 4?", "Why?")
  ]
  key = lambda problem, seed: prompt_dataset.normalized_question(problem.question)
  pick_train = lambda seeds: [pool[s] for s in seeds]
  pick_held = lambda seeds: [held[s - OFFSET] for s in seeds]
  tasks = protocol.EnvTasks(None, pick_train, pick_held, pool=2, content_key=key)
  got = held_out.choose(tasks, held_out.train_seeds(tasks, 100, 8), OFFSET, 2, max_draws=4)
  assert got.seeds == (OFFSET + 1, OFFSET + 3)
  assert (got.overlap_before, got.distinct_before) == (1, 2)


WORDS = st.lists(st.text("abcXYZ019?.,", min_size=1, max_size=6), min_size=1, max_size=6)
SPACES = st.lists(st.sampled_from([" ", "\t", "\n", "  ", " \r\n"]), min_size=7, max_size=7)


@given(WORDS, SPACES, st.booleans())
def test_normalized_question_ignores_case_and_spacing_only(words, spaces, upper):
  """The same words under any spacing and case give one key; other words another.
  Mutation caught: the normaliser not lowering case (`.lower()` dropped)."""
  norm = prompt_dataset.normalized_question
  spaced = spaces[0] + "".join(w + s for w, s in zip(words, spaces[1:]))
  want = " ".join(words).lower()
  assert norm(spaced.upper() if upper else spaced) == want
  assert norm(spaced + "1") != want and norm("Tom has 3 apples.") != norm("Tom has 30 apples.")


def test_gsm8k_evaluation_skips_training_questions_and_repeats():
  """eval.held_out_problems (experiments.eval_gsm8k's set): a test problem asking a
  training question (other case, spacing) or an earlier test question is skipped; on the
  train split nothing is. The outcome lines score each completion. Mutation caught: the
  exclusion skipping training questions only on an exact match (`key` as the raw text)."""
  from rlpost.data.gsm8k import Problem  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import eval as evaluation  # pylint: disable=g-import-not-at-top

  q = lambda text, final="1": Problem(text, f"#### {final}", final)
  trained = [q("How many cats?"), q("Why  not?")]
  test = [q("how many CATS?"), q("What is 2+2?", "4"), q("What is 2+2? "), q("Why?"), q("Who?")]
  kept, ids, counts = evaluation.held_out_problems(test, trained, 2, "test")
  assert ids == [1, 3] and kept == [test[1], test[3]]
  assert counts == {"overlap_before": 1, "distinct_before": 2, "overlap": 0, "distinct": 2}
  kept, ids, counts = evaluation.held_out_problems(test, trained, 3, "train")
  assert ids == [0, 1, 2] and counts["overlap_before"] == 1
  lines = evaluation.problem_items([test[1]] * 2, ["<answer>4</answer>", "5"], [1, 1])
  assert [(x["item"], x["success"], x["reward"]) for x in lines] == [
    (1, True, 1.0),
    (1, False, 0.0),
  ]
  assert lines[0]["key"] == held_out.key_digest("what is 2+2?")
  assert lines[0]["answer"] == lines[1]["answer"] == "4"  # the seeds report's constant answer


def test_gsm8k_test_split_shares_no_question_with_train():
  """The figure the eval module's docstring states: all 1,319 test problems kept."""
  from conftest import GSM8K_DIR, require_shared  # pylint: disable=g-import-not-at-top

  from rlpost.data import gsm8k  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import eval as evaluation  # pylint: disable=g-import-not-at-top

  data = str(require_shared(GSM8K_DIR))
  test, train = gsm8k.load_gsm8k("test", data), gsm8k.load_gsm8k("train", data)
  _, ids, counts = evaluation.held_out_problems(test, train, len(test), "test")
  assert len(ids) == len(test) == 1319 and counts["overlap_before"] == 0


@pytest.mark.slow
def test_gsm8k_evaluate_writes_each_problems_outcome(tmp_path):
  """evaluate(..., outcomes=(workdir, step, ids)) on the tiny random model: one line per
  problem, its index and question digest, success as the report's greedy accuracy. Over
  3 s: the tiny sampler's compilation. Mutation caught: `evaluate` not writing (its
  `if outcomes:` as `if False:`)."""
  import jax  # pylint: disable=g-import-not-at-top

  from rlpost import sampling  # pylint: disable=g-import-not-at-top
  from rlpost.data.gsm8k import Problem  # pylint: disable=g-import-not-at-top
  from rlpost.models import decoder, families  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import eval as evaluation  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import item_outcomes  # pylint: disable=g-import-not-at-top
  from rlpost.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  config = families.get_config("tiny")
  params = decoder.init_params(jax.random.key(0), config)
  sc = sampling.SamplingConfig(max_new_tokens=4, prompt_bucket=8, stop_ids=(1,))
  problems = [Problem(f"q{k}", "#### 1", "1") for k in range(3)]
  report = evaluation.evaluate(
    params,
    config,
    tokenizer_lib.byte_tokenizer(),
    problems,
    template="plain",
    examples=[],
    sampling_config=sc,
    pass_k=0,
    outcomes=(str(tmp_path), 7, [4, 9, 11]),
  )
  (lines,) = item_outcomes.read(str(tmp_path)).values()
  assert list(item_outcomes.read(str(tmp_path))) == [7]
  assert [x["item"] for x in lines] == [4, 9, 11]
  assert [x["key"] for x in lines] == [held_out.key_digest(f"q{k}") for k in range(3)]
  assert sum(x["success"] for x in lines) / 3 == report["greedy_answer_accuracy"]
