"""Evaluation accuracies and pass@k on hand-made completions; the few-shot prompt text."""

import os

import jax
import pytest

from rlpost.recipes import eval as evaluation
from rlpost.recipes import eval_progress
from rlpost.recipes import item_outcomes
from rlpost.serve import engine as engine_lib
from rlpost.serve import offline
from rlpost import sampling
from rlpost.data import prompts as prompts_lib
from rlpost.data.gsm8k import Problem
from rlpost.models import decoder
from rlpost.models import families
from rlpost.text import tokenizer as tokenizer_lib
from conftest import GSM8K_DIR, require_shared

PROBLEMS = [
  Problem("q0", "a\n#### 7", "7"),
  Problem("q1", "b\n#### 12", "12"),
  Problem("q2", "c\n#### 3", "3"),
]


def _done(number: str) -> str:
  return f"<reasoning>\nwork\n</reasoning>\n<answer>{number}</answer>"


def test_accuracy_report_on_hand_made_completions():
  """Mutation caught: pass@k as ALL samples correct (`.all(1)`) instead of ANY."""
  greedy = [_done("7"), "<answer>12</answer>", _done("4")]  # right+format, right, wrong+format
  samples = [
    _done("1"),
    _done("7"),
    "no",  # q0: one of three right
    _done("12"),
    "<answer>12</answer>",
    _done("12"),  # q1: all three right
    _done("2"),
    "3",
    "<answer>4</answer>",
  ]  # q2: none right
  report = evaluation.accuracy_report(PROBLEMS, greedy, samples, pass_k=3)
  assert report["greedy_answer_accuracy"] == pytest.approx(2 / 3)
  assert report["greedy_format_accuracy"] == pytest.approx(2 / 3)
  assert report["pass@3"] == pytest.approx(2 / 3)
  assert [e["truth"] for e in report["examples"]] == ["7", "12", "3"]
  assert "pass@0" not in evaluation.accuracy_report(PROBLEMS, greedy, [], pass_k=0)


def test_the_env_blocks_checker_decides_what_is_correct():
  """`answer_checker("math_verify")` (config.env.checker) accepts an answer math-verify
  finds equal (a fraction, a spaced thousand) that GSM8K's own check rejects, in the report
  and the per-item outcomes alike (evaluate_run passes the env block's checker). Mutation
  caught: answer_checker ignoring its argument (GSM8K's own check always)."""
  greedy = [_done("\\frac{14}{2}"), _done("12"), _done("4")]
  exact = evaluation.accuracy_report(PROBLEMS, greedy, [], 0, evaluation.answer_checker())
  verify = evaluation.answer_checker("math_verify")
  assert exact["greedy_answer_accuracy"] == pytest.approx(1 / 3)
  report = evaluation.accuracy_report(PROBLEMS, greedy, [], 0, verify)
  assert report["greedy_answer_accuracy"] == pytest.approx(2 / 3)
  items = evaluation.problem_items(PROBLEMS, greedy, [0, 1, 2], verify)
  assert [i["success"] for i in items] == [True, True, False]


def test_accuracy_report_rejects_misaligned_completions():
  with pytest.raises(ValueError, match="3 problems need 3 greedy completions and 6 samples"):
    evaluation.accuracy_report(PROBLEMS, ["a"] * 3, ["b"] * 5, pass_k=2)


@pytest.mark.slow
def test_evaluate_runs_the_sampler_per_problem():
  """End to end on the tiny random model: one greedy and pass_k samples per problem."""
  config = families.get_config("tiny")
  params = decoder.init_params(jax.random.key(0), config)
  sc = sampling.SamplingConfig(max_new_tokens=4, prompt_bucket=8, stop_ids=(1,))
  report = evaluation.evaluate(
    params,
    config,
    tokenizer_lib.byte_tokenizer(),
    PROBLEMS,
    template="plain",
    examples=[],
    sampling_config=sc,
    batch_size=2,
    pass_k=2,
  )
  assert report["num_problems"] == 3 and report["template"] == "plain"
  assert report["pass@2"] == 0.0 and report["greedy_answer_accuracy"] == 0.0
  assert [e["question"] for e in report["examples"]] == ["q0", "q1", "q2"]


class Interrupted(Exception):
  """The kill the resume test stands in for."""


@pytest.mark.slow
def test_an_interrupted_evaluation_samples_only_its_unfinished_chunks(tmp_path, monkeypatch):
  """5 problems in chunks of 2, greedy (2 slots) and 1 sample each: killed as the last
  chunk draws its samples, the evaluation started again decodes and samples that chunk's
  problems only, and its report and per-problem outcomes equal an uninterrupted one's;
  the kept chunks are gone afterwards. Other weights or other problems reuse nothing.
  Mutations caught: the digest without the weights (changed weights reuse chunks);
  nothing kept (`keep = False`)."""
  config = families.get_config("tiny")
  params = decoder.init_params(jax.random.key(0), config)
  sc = sampling.SamplingConfig(max_new_tokens=4, prompt_bucket=8, stop_ids=(1,))
  problems = PROBLEMS + [Problem("q3", "d\n#### 5", "5"), Problem("q4", "e\n#### 6", "6")]
  ids = [10, 11, 12, 13, 14]
  inner, inner_decode = evaluation._completions, offline.decode_all

  def run(workdir, weights=params, items=problems, fail_at=None):
    calls, decoded = [], []

    def completions(*args):
      calls.append([p.question for p in args[3]])
      if len(calls) == fail_at:
        raise Interrupted
      return inner(*args)

    def decode_all(engine, prompts, **kwargs):
      decoded.append(len(prompts))
      return inner_decode(engine, prompts, **kwargs)

    monkeypatch.setattr(evaluation, "_completions", completions)
    monkeypatch.setattr(offline, "decode_all", decode_all)
    kwargs = dict(template="plain", examples=[], sampling_config=sc, batch_size=2, pass_k=1)
    out = (str(workdir), 0, ids)
    report = evaluation.evaluate(
      weights, config, tokenizer_lib.byte_tokenizer(), items, outcomes=out, **kwargs
    )
    return calls, decoded, report

  order, decoded, want = run(tmp_path / "whole")
  assert sorted(order) == [["q0", "q1"], ["q2", "q3"], ["q4"]] and decoded == [5]
  cut = tmp_path / "cut"
  with pytest.raises(Interrupted):
    run(cut, fail_at=3)  # the last chunk's samples: the other two are kept
  assert len(os.listdir(eval_progress.folder(str(cut), 0))) == 2
  calls, decoded, got = run(cut)
  assert calls == [order[-1]] and decoded == [len(order[-1])]
  assert got == want
  assert item_outcomes.read(str(cut)) == item_outcomes.read(str(tmp_path / "whole"))
  assert not os.path.exists(eval_progress.folder(str(cut), 0))

  for kind in ("weights", "problems"):
    other = tmp_path / kind
    with pytest.raises(Interrupted):
      run(other, fail_at=3)
    moved = jax.tree.map(lambda x: x * 1.001, params) if kind == "weights" else params
    renamed = [p._replace(question=p.question + "?") for p in problems]
    calls, decoded, _ = run(other, moved, renamed if kind == "problems" else problems)
    assert len(calls) == 3 and decoded == [5], kind


@pytest.mark.slow
@pytest.mark.parametrize("template", ["fewshot", "plain"])
def test_greedy_completions_by_slots_equal_the_samplers(template, monkeypatch):
  """The greedy completions through continuous batching (2 slots for 6 problems, so rows
  join as others end) equal the batched sampler's (`_completions`, 3 problems a call)
  text for text: cut at the same stop string (one taken from the sampler's own first
  completion, so cuts happen; "plain" cuts nothing) and ended at the same stop id.
  Mutations caught: the slots' text not cut at the stop string; the stop ids left at the
  engine's instead of the sampling config's."""
  config = families.get_config("tiny")
  params = decoder.init_params(jax.random.key(3), config)
  tok = tokenizer_lib.byte_tokenizer()
  problems = [Problem(f"question {i} " + "x" * i, "s\n#### 1", "1") for i in range(6)]
  prompt = prompts_lib.prompt_ids(problems[2], template, [], tok)
  engine = engine_lib.Engine(params, config, tok, "tiny", len(prompt) + 12, 12)
  stop_id = offline.decode_all(engine, [prompt], budget=12, rows=1)[0][5]  # ends problem 2
  sc = sampling.SamplingConfig(
    temperature=0.0, max_new_tokens=12, prompt_bucket=8, stop_ids=(stop_id,)
  )
  want = lambda: [
    text
    for start in (0, 3)
    for text in evaluation._completions(
      params, config, tok, problems[start : start + 3], template, [], sc, jax.random.key(0), 1
    )
  ]
  plain = want()
  prefix = prompts_lib.completion_prefix(template)
  stop = plain[0][len(prefix) :][3:5]  # two characters the first completion holds
  monkeypatch.setattr(prompts_lib, "STOP_STRINGS", (stop,))
  expected = want()
  got = [None] * 6
  evaluation._greedy_by_slots(
    params,
    config,
    tok,
    problems,
    template,
    [],
    sc,
    list(range(6)),
    2,
    lambda i, text: got.__setitem__(i, text),
  )
  assert got == expected
  cut = sum(len(a) < len(b) for a, b in zip(expected, plain))
  assert cut >= 1 if template == "fewshot" else expected == plain


def test_fewshot_prompt_text():
  """System text, each solved example in the tag format, the question, the opened tag."""
  example = Problem(
    "How many legs do 2 cats have?", "Each cat has 4 legs.\n2 * 4 = <<2*4=8>>8\n#### 8", "8"
  )
  problem = Problem("What is 3 + 4?", "3 + 4 = 7\n#### 7", "7")
  text = prompts_lib.prompt_text(problem, "fewshot", [example])
  assert text == (
    prompts_lib.SYSTEM_PROMPT + "\n\n"
    "Question: How many legs do 2 cats have?\n"
    "Answer: <reasoning>\nEach cat has 4 legs.\n2 * 4 = 8\n</reasoning>\n"
    "<answer>8</answer>\n\n"
    "Question: What is 3 + 4?\n"
    "Answer: <reasoning>\n"
  )
  assert prompts_lib.completion_prefix("fewshot") == "<reasoning>\n"
  assert prompts_lib.completion_prefix("chat") == ""
  assert prompts_lib.prompt_text(problem, "plain", [example]) == "What is 3 + 4?"
  with pytest.raises(ValueError, match="data.template='cot'"):
    prompts_lib.prompt_text(problem, "cot", [])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_evaluate_run_restores_the_trained_policy_of_either_recipe(recipe, tmp_path):
  """A run's checkpoint is evaluated with the recipe that wrote it (its trainable["policy"]).

  Mutation caught: evaluating a PPO run with the GRPO learner (its state does not
  match the checkpoint).
  """
  from experiments.configs import grpo_gsm8k, ppo_gsm8k
  from rlpost.recipes import learners, rl

  config = grpo_gsm8k if recipe == "grpo" else ppo_gsm8k
  cfg = config.get_config("tiny")
  with cfg.unlocked():
    cfg.env.data_dir = str(require_shared(GSM8K_DIR))
    cfg.train.steps, cfg.checkpoint.every = 3, 3
    if recipe == "ppo":
      cfg.algo.critic_warmup_steps = 1
  rl.run(cfg, str(tmp_path))
  report = evaluation.evaluate_run(cfg, str(tmp_path), num_problems=2, pass_k=0)
  assert report["trained"]["iteration"] == 3 and report["trained"]["num_problems"] == 2
  assert "base" in report
  assert learners.name_of(cfg) == recipe
  no_base = evaluation.evaluate_run(cfg, str(tmp_path), num_problems=2, pass_k=0, base=False)
  assert "base" not in no_base and no_base["trained"] == report["trained"]


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"num_problems": 0}, r"config\.eval\.num_problems=0: must be >= 1"),
    ({"pass_k": -1}, r"config\.eval\.pass_k=-1: must be >= 0"),
    ({"batch_size": 0}, r"config\.eval\.batch_size=0: must be an integer >= 1"),
    # Mutation caught: loading the problems after the model (as before) built the model
    # first, then refused the --split flag.
    ({"split": "validation"}, r"GSM8K split 'validation' does not exist; use one of"),
  ],
)
def test_evaluate_run_rejects_bad_counts_and_splits_before_loading(kwargs, match, monkeypatch):
  from experiments.configs import grpo_gsm8k
  from rlpost.recipes import common

  def no_build(cfg):
    raise AssertionError("the model was built before the counts and split were checked")

  monkeypatch.setattr(common, "load_model", no_build)
  with pytest.raises(ValueError, match=match):
    evaluation.evaluate_run(grpo_gsm8k.get_config("tiny"), **kwargs)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_pass_at_k_samples_at_the_configs_temperature(bad, monkeypatch):
  """`eval.pass_temperature` reaches the sampler of both evaluations (it was fixed at 0.8
  whatever the config said), as `eval.batch_size` does (or the --batch_size flag's); a
  temperature that cannot sample is refused before the model loads, unless pass_k is 0
  (greedy only). A run's config.json without the fields evaluates at the old 0.8, 8 at once.

  Mutations caught: `evaluate_run` not passing the temperature on; the check on
  `temperature < 0` (0 and NaN slip through).
  """
  from conftest import with_overrides
  from experiments.configs import grpo_gsm8k
  from rlpost.recipes import common

  data = {"data.data_dir": str(require_shared(GSM8K_DIR))}
  used = []
  monkeypatch.setattr(
    evaluation, "evaluate", lambda *a, **k: used.append((k["temperature"], k["batch_size"]))
  )
  evaluation.evaluate_run(
    with_overrides(
      grpo_gsm8k.get_config("tiny"),
      {**data, "eval.pass_temperature": 1.3, "eval.batch_size": 3},
    ),
    num_problems=1,
  )
  old = with_overrides(grpo_gsm8k.get_config("tiny"), data)
  with old.unlocked():
    del old.eval["pass_temperature"]
    del old.eval["batch_size"]
  evaluation.evaluate_run(old, num_problems=1)
  evaluation.evaluate_run(old, num_problems=1, batch_size=5)
  assert used == [(1.3, 3), (0.8, 8), (0.8, 5)]

  def no_build(cfg):
    raise AssertionError("the model was built before eval.pass_temperature was checked")

  monkeypatch.setattr(common, "load_model", no_build)
  bad_cfg = with_overrides(grpo_gsm8k.get_config("tiny"), {**data, "eval.pass_temperature": bad})
  with pytest.raises(ValueError, match=r"config\.eval\.pass_temperature=.*finite number > 0"):
    evaluation.evaluate_run(bad_cfg, num_problems=1)
  with pytest.raises(AssertionError, match="built before"):  # pass_k=0: no check, on to build
    evaluation.evaluate_run(bad_cfg, num_problems=1, pass_k=0)
