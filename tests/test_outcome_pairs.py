"""Outcome pairs from a model's own GSM8K solutions (rlpost.data.outcome_pairs and
experiments/outcome_pairs.py)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import GSM8K_DIR, REPO_ROOT, require_shared

from rlpost.data import chat
from rlpost.data import gsm8k
from rlpost.data import outcome_pairs
from rlpost.data import prompts
from rlpost.text import tokenizer as tokenizer_lib


def _problem(question: str, final: str) -> gsm8k.Problem:
  return gsm8k.problem_from_record(
    {"question": question, "answer": f"Half is <<8/2=4>>4.\n#### {final}"}, "test"
  )


def _answer(number: str) -> str:
  return f"<reasoning>\nwork\n</reasoning>\n<answer>{number}</answer>"


def test_each_wrong_sample_is_rejected_against_a_correct_one_or_the_reference():
  """Problem 0 (one of three right): both wrong samples pair with the right one; problem 1
  (none right): its wrong samples pair with the reference solution, itself right; every
  sample is an example with its label; the records load as DPO pairs and KTO examples.

  Mutation caught: pairing a problem's wrong samples with another problem's right one."""
  problems = [_problem("How many?", "4"), _problem("How much?", "7")]
  samples = [_answer("4"), _answer("5"), "no tags", _answer("8"), _answer("9"), _answer("6")]
  pairs, examples = outcome_pairs.records(problems, samples, 3)
  assert [(p["problem"], p["chosen"], p["rejected"], p["chosen_source"]) for p in pairs] == [
    (0, _answer("4"), _answer("5"), "sample"),
    (0, _answer("4"), "no tags", "sample"),
    (1, gsm8k.sft_completion(problems[1]), _answer("8"), "reference"),
    (1, gsm8k.sft_completion(problems[1]), _answer("9"), "reference"),
    (1, gsm8k.sft_completion(problems[1]), _answer("6"), "reference"),
  ]
  assert [e["label"] for e in examples] == [True, False, False, False, False, False]
  assert all(p["prompt"] == problems[p["problem"]].question for p in pairs + examples)
  assert [chat.dpo_fields(p)["system"] for p in pairs] == [gsm8k.SYSTEM_PROMPT] * 5
  assert [chat.kto_fields(e)["label"] for e in examples] == [e["label"] for e in examples]
  with pytest.raises(ValueError, match="2 problems x k=3 samples need 6, got 5"):
    outcome_pairs.records(problems, samples[:5], 3)


def test_pairs_lay_their_prompt_out_as_the_chat_template_rollouts():
  """A pair's prompt ids (DPO's tokenizer: what the reward model is trained on) equal the
  RL recipes' `data.template=chat` prompt ids of the same problem."""
  tok = tokenizer_lib.byte_tokenizer()
  problem = _problem("Tom has 8 apples and eats half. How many are left?", "4")
  pairs, _ = outcome_pairs.records([problem], [_answer("5")], 1)
  prompt_ids, _, _ = chat.tokenize_dpo(pairs[0], tok, 2048)
  assert list(prompt_ids) == prompts.prompt_ids(problem, "chat", [], tok)


def _cli(out, *extra):
  command = [
    sys.executable,
    "-m",
    "experiments.outcome_pairs",
    "--config=experiments/configs/grpo_gsm8k.py:tiny",
    "--config.data.source=gsm8k",
    "--config.data.template=chat",
    f"--config.data.data_dir={GSM8K_DIR}",
    "--config.sampling.max_new_tokens=6",
    "--config.sampling.temperature=1.0",
    "--num_problems=4",
    "--samples=2",
    "--batch_problems=2",
    f"--out={out}",
    *extra,
  ]
  done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return {
    name: open(os.path.join(out, name), encoding="utf-8").read()
    for name in ("pairs.jsonl", "examples.jsonl", "summary.json")
  }


@pytest.mark.slow
def test_the_cli_writes_loadable_files_and_resumes_after_its_last_whole_batch(tmp_path):
  """The tiny model on 4 GSM8K problems x 2 samples: 8 labelled examples and a pair per
  wrong one, loadable by the DPO and KTO readers. Then the run is cut back to its first
  batch with a torn line after it (an interruption mid-write): started again, it writes
  the same files. Mutation caught: resuming without truncating the files (the torn line
  and the second batch twice)."""
  require_shared(GSM8K_DIR)
  whole = _cli(tmp_path / "run")
  examples = chat.load_kto_jsonl(tmp_path / "run" / "examples.jsonl")
  pairs = chat.load_dpo_jsonl(tmp_path / "run" / "pairs.jsonl")
  assert len(examples) == 8 and len(pairs) == sum(not e["label"] for e in examples)
  summary = json.loads(whole["summary.json"])
  assert summary["examples"] == 8 and summary["pairs"] == len(pairs)

  progress_path = tmp_path / "run" / "progress.json"
  progress = json.loads(progress_path.read_text())
  sizes = {}
  for name in ("pairs.jsonl", "examples.jsonl"):
    lines = whole[name].splitlines(keepends=True)
    first = [line for line in lines if json.loads(line)["problem"] < 2]
    sizes[name] = len("".join(first).encode())
    (tmp_path / "run" / name).write_text("".join(first) + '{"torn": ')
  progress_path.write_text(json.dumps({**progress, "problems": 2, "bytes": sizes}))
  assert _cli(tmp_path / "run") == whole
