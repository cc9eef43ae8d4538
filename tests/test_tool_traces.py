"""GSM8K calculator annotations -> tool-call traces: conversion, drops, and the token stream."""

from rlpost.envs import tool_traces
from rlpost.data.gsm8k import Problem
from rlpost.text import scaffold
from rlpost.text import tokenizer as tokenizer_lib

TOK = tokenizer_lib.byte_tokenizer()


def _problem(answer: str, final: str = "72") -> Problem:
  return Problem(question="How many?", answer=answer, final=final)


def test_two_step_solution_becomes_calls_and_results():
  answer = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"
  )
  trace = tool_traces.tool_trace(_problem(answer))
  assert trace == [
    ("model", "Natalia sold 48/2 = <tool>calculator: 48/2</tool>"),
    ("tool", "<result>24</result>"),
    ("model", "24 clips in May.\nNatalia sold 48+24 = <tool>calculator: 48+24</tool>"),
    ("tool", "<result>72</result>"),
    ("model", "72 clips altogether.\n</reasoning>\n<answer>72</answer>"),
  ]


def test_decimal_results_and_solutions_without_annotations():
  trace = tool_traces.tool_trace(_problem("She earns 12/60 = $<<12/60=0.2>>0.2.\n#### 0.2", "0.2"))
  assert trace[1] == ("tool", "<result>0.2</result>")
  plain = tool_traces.tool_trace(_problem("Just count: 7.\n#### 7", "7"))
  assert plain == [("model", "Just count: 7.\n</reasoning>\n<answer>7</answer>")]


def test_bad_annotations_are_dropped_and_counted():
  cases = {
    "wrong": _problem("x = <<2+2=5>>5\n#### 5"),  # the calculator says 4
    "rounded": _problem("x = <<10/3=3.33>>3.33\n#### 3"),  # 3.333333 is not 3.33
    "two_equals": _problem("x = <<2+2=4=4>>4\n#### 4"),
    "no_result": _problem("x = <<2+2=>>4\n#### 4"),
    "words": _problem("x = <<two+2=4>>4\n#### 4"),
    "text_result": _problem("x = <<2+2=four>>4\n#### 4"),
    "unclosed": _problem("x = <<2+2=4 then 4\n#### 4"),
    "no_final": _problem("x = <<2+2=4>>4"),
    "good": _problem("x = <<2+2=4>>4\n#### 4", "4"),
  }
  reasons = {k: tool_traces.tool_trace(p) for k, p in cases.items()}
  assert reasons["wrong"] == reasons["rounded"] == "result disagrees"
  assert (
    reasons["two_equals"]
    == reasons["no_result"]
    == reasons["text_result"]
    == ("malformed annotation")
  )
  assert reasons["words"] == "calculator error"
  assert reasons["unclosed"] == "malformed annotation"
  assert reasons["no_final"] == "no final answer"
  kept, dropped = tool_traces.tool_traces(list(cases.values()))
  assert [p for p, _ in kept] == [cases["good"]]
  assert dropped == {
    "result disagrees": 2,
    "malformed annotation": 4,
    "calculator error": 1,
    "no final answer": 1,
  }
  # A limit stops the reading once that many are kept; the counts cover what was read.
  # Mutation caught: the limit compared with > (one trace too many).
  order = [cases["wrong"], cases["good"], cases["words"], cases["good"]]
  kept, dropped = tool_traces.tool_traces(order, limit=1)
  assert [p for p, _ in kept] == [cases["good"]] and dropped == {"result disagrees": 1}
  assert len(tool_traces.tool_traces(order, limit=2)[0]) == 2


def test_trace_ids_are_the_rollout_stream_with_loss_on_model_text_only():
  trace = tool_traces.tool_trace(_problem("a = <<3*4=12>>12\nb = <<12+60=72>>72\n#### 72"))
  ids, mask = tool_traces.trace_ids(TOK, "chat", "Q: how many?", trace)
  assert len(ids) == len(mask)
  expected = scaffold.prompt_ids(TOK, "chat", "Q: how many?")
  expected_mask = [0] * len(expected)
  for k, (role, text) in enumerate(trace):
    if role == "model":
      new = TOK.encode(text, add_bos=False, parse_special=False)
      new += [TOK.end_of_turn_id] if k == len(trace) - 1 else []
      expected, expected_mask = expected + new, expected_mask + [1] * len(new)
    else:
      new = scaffold.observation_ids(TOK, "chat", text, model_closed_turn=False)
      expected, expected_mask = expected + new, expected_mask + [0] * len(new)
  assert ids == expected and mask == expected_mask
  trained = TOK.decode([i for i, m in zip(ids, mask) if m])
  assert "<result>" not in trained and trained.count("<tool>") == 2
  assert TOK.decode([i for i, m in zip(ids, mask) if not m]).count("<result>") == 2
