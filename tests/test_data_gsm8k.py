"""GSM8K loading (real files, malformed files, Hugging Face path) and the SFT format."""

import json
import re
import sys
import types

import pytest

from conftest import GSM8K_DIR, require_shared
from rlpost import errors
from rlpost.data import gsm8k

# Independent statement of the target format (what the GRPO format reward accepts).
_FORMAT = re.compile(r"\A<reasoning>\n(.+)\n</reasoning>\n<answer>([^<>\n]+)</answer>\Z", re.DOTALL)


def _write(tmp_path, lines, name="data.jsonl"):
  path = tmp_path / name
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return path


def _row(question="Q?", answer="Work 1+1 = <<1+1=2>>2.\n#### 2"):
  return json.dumps({"question": question, "answer": answer})


@pytest.mark.shared_data
@pytest.mark.parametrize("split,count", [("train", 7473), ("test", 1319)])
def test_real_splits_parse_and_convert(split, count):
  data_dir = require_shared(GSM8K_DIR)
  problems = gsm8k.load_gsm8k(split, data_dir=str(data_dir))
  assert len(problems) == count
  with open(data_dir / f"{split}.jsonl", encoding="utf-8") as f:
    raw = [json.loads(line) for line in f]
  for problem, row in zip(problems, raw):
    assert problem.question == row["question"] and problem.answer == row["answer"]
    tail = row["answer"].split("\n")[-1]
    assert tail.startswith("#### ") and problem.final == tail[5:].replace(",", "")
    assert re.fullmatch(r"-?\d+(\.\d+)?", problem.final), problem.final
    match = _FORMAT.match(gsm8k.sft_completion(problem))
    assert match, problem
    assert match.group(2) == problem.final
    assert "<<" not in match.group(1) and ">>" not in match.group(1)
    assert "####" not in match.group(1)


def test_first_train_row_completion_text(tmp_path):
  # GSM8K train row 0, typed in by hand from the dataset card.
  answer = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
  )
  path = _write(tmp_path, [_row("How many clips?", answer)])
  [problem] = gsm8k.load_jsonl_problems(path)
  assert problem == gsm8k.Problem("How many clips?", answer, "72")
  assert gsm8k.sft_completion(problem) == (
    "<reasoning>\nNatalia sold 48/2 = 24 clips in May.\n"
    "Natalia sold 48+24 = 72 clips altogether in April and May.\n</reasoning>\n"
    "<answer>72</answer>"
  )


def test_commas_removed_and_blank_lines_skipped(tmp_path):
  path = _write(tmp_path, [_row(answer="Big.\n#### 1,234,567"), "  ", _row()])
  problems = gsm8k.load_jsonl_problems(path)
  assert [p.final for p in problems] == ["1234567", "2"]


@pytest.mark.parametrize(
  "bad_line,needle",
  [
    ('{"question": "Q", "answer": ', "invalid JSON"),
    ('["not", "an", "object"]', "expected a JSON object"),
    ('{"question": "Q"}', "missing field 'answer'"),
    ('{"answer": "#### 3"}', "missing field 'question'"),
    ('{"question": 5, "answer": "#### 3"}', "'question' must be a string"),
    ('{"question": "Q", "answer": "no final line"}', "no '#### <number>'"),
    ('{"question": "Q", "answer": "x\\n####  "}', "nothing after '####'"),
  ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, needle):
  path = _write(tmp_path, [_row(), _row(), bad_line, _row()])
  with pytest.raises(ValueError) as err:
    gsm8k.load_jsonl_problems(path)
  assert f"{path}:3:" in str(err.value)
  assert needle in str(err.value)


def test_missing_file_and_bad_split(tmp_path):
  with pytest.raises(FileNotFoundError, match="train.jsonl"):
    gsm8k.load_gsm8k("train", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="'validation'"):
    gsm8k.load_gsm8k("validation", data_dir=str(tmp_path))


def test_hub_without_datasets_names_data_dir(monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
  with pytest.raises(errors.DataError, match="needs the `datasets` package.*data_dir"):
    gsm8k.load_gsm8k("test")


def test_hub_unreachable_names_data_dir(monkeypatch):
  def load_dataset(*args):
    raise ConnectionError(f"cannot reach hub for {args}")

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  with pytest.raises(errors.DataError, match="data_dir") as err:
    gsm8k.load_gsm8k("test")
  assert "ConnectionError" in str(err.value)


def test_hub_rows_are_parsed(monkeypatch):
  calls = []

  def load_dataset(*args):
    calls.append(args)
    return {
      "train": [{"question": "A?", "answer": "1+1\n#### 2"}],
      "test": [{"question": "B?", "answer": "oops"}],
    }

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  assert gsm8k.load_gsm8k("train") == [gsm8k.Problem("A?", "1+1\n#### 2", "2")]
  assert calls == [("openai/gsm8k", "main")]
  with pytest.raises(ValueError, match=r"openai/gsm8k\[test\] row 0"):
    gsm8k.load_gsm8k("test")


def test_system_prompt_names_all_tags():
  for tag in (gsm8k.REASONING_START, gsm8k.REASONING_END, gsm8k.ANSWER_START, gsm8k.ANSWER_END):
    assert tag in gsm8k.SYSTEM_PROMPT


def test_a_final_answer_that_is_not_a_number_names_the_line(tmp_path):
  """'#### 72 dollars' in a GSM8K-format file fails naming path:line and the fix: such a
  truth can never equal a parsed answer, so every completion would silently score 0 on
  check_numbers and answer accuracy. Commas and signs stay accepted.

  Mutation caught: problem_from_record without the float(final) check.
  """
  path = _write(tmp_path, [_row(), '{"question": "Q", "answer": "x\\n#### 72 dollars"}'])
  with pytest.raises(
    ValueError, match=rf"{re.escape(str(path))}:2: .*'#### 72 dollars', not a number"
  ):
    gsm8k.load_jsonl_problems(path)
  path = _write(tmp_path, ['{"question": "Q", "answer": "x\\n#### -1,234.5"}'], name="ok.jsonl")
  assert gsm8k.load_jsonl_problems(path)[0].final == "-1234.5"
