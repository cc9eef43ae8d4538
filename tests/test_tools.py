"""The calculator tool (AST whitelist, bounded, never raises), tool-call parsing and running,
the `with_tools` env wrapper, and a scan of the tree for `eval`/`exec`."""

import ast
import json
import math
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT
from rlpost.envs import tools
from rlpost.envs.calculator import calculator
from rlpost.envs.protocol import Env, Step
from rlpost.envs.tools import format_number, run_tool, with_tools
from rlpost.text.tool_syntax import CALL_CLOSE, TRUNCATION_MARKER, ToolCall, parse_tool_call

# ---------------------------------------------------------------- calculator: good input

GOOD = [
  ("3*(4+5)", 3 * (4 + 5)),
  ("12*(3+4)/2", 12 * (3 + 4) / 2),
  ("48/2", 48 / 2),
  ("1/3", 1 / 3),
  ("-5", -5),
  ("+7-10", +7 - 10),
  ("-(2+3)*4", -(2 + 3) * 4),
  ("2**10", 2**10),
  ("2**-2", 2**-2),
  ("-2**2", -(2**2)),
  ("(-2)**3", (-2) ** 3),
  ("0.1+0.2", 0.1 + 0.2),
  ("2.5*4", 2.5 * 4),
  ("10/4", 10 / 4),
  ("7 - 10/3", 7 - 10 / 3),
  ("1e3+1", 1e3 + 1),
  ("1,000 + 2", 1000 + 2),
  ("1,234,567 * 2", 1234567 * 2),
  ("6 × 7", 6 * 7),
  ("84 ÷ 8", 84 / 8),
  ("(((1)))", 1),
  ("(" * 99 + "1" + ")" * 99, 1),
]


def test_calculator_worked_example():
  assert calculator("12*(3+4)/2") == "42"


@pytest.mark.parametrize("expression, expected", GOOD)
def test_calculator_matches_python_arithmetic(expression, expected):
  assert calculator(expression) == format_number(expected)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_calculator_matches_python_on_random_integers(a, b, c):
  assert calculator(f"{a}*({b})-({c})") == format_number(a * b - c)
  if b != 0:
    assert calculator(f"({a})/({b})") == format_number(a / b)


# ---------------------------------------------------------------- calculator: hostile input

HOSTILE = [
  "__import__('os')",
  "__import__('os').system('echo hi')",
  "().__class__",
  "().__class__.__bases__[0].__subclasses__()",
  "(1).real",
  "os",
  "abs(-1)",
  "lambda: 1",
  "9**9**9",
  "10**10**10",
  "2**1000",
  "2**64",
  "(1e15)**64",
  "1e15*1e15",
  "1e400",
  "1/0",
  "0**-1",
  "(-8)**0.5",
  "'a'*3",
  "b'1'",
  'f"{1}"',
  "[1][0]",
  "[x for x in (1,)]",
  "{1: 2}",
  "(1, 2)",
  "1 if 1 else 2",
  "1<2",
  "1 and 2",
  "not 1",
  "~1",
  "7//2",
  "7%2",
  "True+1",
  "None",
  "...",
  "1j",
  "(x := 1)",
  "1,0000",
  "1.5,000",
  "",
  "\x00",
  '"1"*10000',
  "1+" * 5000 + "1",
  "x" * 10000,
  "(" * 150,
  "(" * 150 + "1" + ")" * 150,
  "-" * 199 + "1",
]

_RUN_HOSTILE = (
  "import json, sys\n"
  "from rlpost.envs.calculator import calculator\n"
  "print(json.dumps([calculator(e) for e in json.load(sys.stdin)]))\n"
)


def test_calculator_hostile_inputs_are_errors_within_a_time_guard():
  # A subprocess with a timeout is a real guard: a runaway big-integer power holds the GIL,
  # which a thread join or signal.alarm in this process could not interrupt.
  try:
    out = subprocess.run(
      [sys.executable, "-c", _RUN_HOSTILE],
      input=json.dumps(HOSTILE),
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      timeout=30,
    )
  except subprocess.TimeoutExpired:
    pytest.fail("the calculator did not finish the hostile inputs within 30 s")
  assert out.returncode == 0, out.stderr[-3000:]
  results = json.loads(out.stdout)
  bad = [(e[:40], r) for e, r in zip(HOSTILE, results) if not r.startswith("error: ")]
  assert not bad, f"hostile inputs that did not give an error: {bad}"
  # Exponent reasons are checked here, under the guard: without the cap they would hang.
  by_input = dict(zip(HOSTILE, results))
  for expression in ["9**9**9", "10**10**10", "2**1000"]:
    assert by_input[expression].startswith("error: exponent too large"), by_input[expression]


@pytest.mark.parametrize(
  "expression, reason",
  [
    ("__import__('os')", "error: calls are not allowed"),
    ("os", "error: names are not allowed: os"),
    ("(1).real", "error: attribute access is not allowed"),
    ("2**64", "error: result too large"),
    ("1/0", "error: division by zero"),
    ("'a'*3", "error: strings are not allowed"),
    ("1,0000", "error: commas are only allowed as thousands separators"),
    ("1+" * 5000 + "1", "error: expression too long"),
    ("-" * 199 + "1", "error: expression nested too deeply"),
  ],
)
def test_calculator_error_reasons(expression, reason):
  assert calculator(expression).startswith(reason)


def test_calculator_rejects_non_string():
  assert calculator(12).startswith("error: ")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(alphabet="0123456789+-*/().,×÷ e_", max_size=60)))
def test_calculator_never_raises_on_random_text(expression):
  result = calculator(expression)
  assert isinstance(result, str)
  if not result.startswith("error: "):
    value = float(result)
    assert math.isfinite(value) and abs(value) <= 1e15, result


# ---------------------------------------------------------------- no eval / exec in the tree

BANNED = {"eval", "exec"}


def _is_banned(node: ast.AST) -> bool:
  """`eval`/`exec` read as a name, `builtins.eval`, a call `x.eval(...)`, `from builtins
  import exec`. A plain attribute read like `cfg.eval.every` (a config section) and a field
  named `eval` (a dataclass's config block) are allowed."""
  if isinstance(node, ast.Name):
    return node.id in BANNED and isinstance(node.ctx, ast.Load)
  if isinstance(node, ast.Attribute) and node.attr in BANNED:
    return isinstance(node.value, ast.Name) and node.value.id in ("builtins", "__builtins__")
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
    return node.func.attr in BANNED
  if isinstance(node, ast.ImportFrom) and node.module == "builtins":
    return any(alias.name in BANNED for alias in node.names)
  return False


def find_eval_exec(roots) -> list[str]:
  """ "file:line: source" for every banned use of eval/exec in .py files under `roots`."""
  hits = []
  for root in roots:
    for path in sorted(pathlib.Path(root).rglob("*.py")):
      tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
      for node in ast.walk(tree):
        if _is_banned(node):
          hits.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
  return hits


def test_no_eval_or_exec_in_the_tree():
  roots = [REPO_ROOT / "rlpost", REPO_ROOT / "experiments"]
  assert all(r.is_dir() for r in roots)
  hits = find_eval_exec(roots)
  assert not hits, "eval/exec found:\n" + "\n".join(hits)


def test_eval_exec_scanner_catches_uses(tmp_path):
  (tmp_path / "bad.py").write_text(
    "x = '1'\n"
    "y = eval(x)\n"
    "import builtins\n"
    "z = builtins.exec\n"
    "model.eval()\n"
    "from builtins import exec as run\n"
  )
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "worse.py").write_text("f = exec\n")
  (tmp_path / "clean.py").write_text(
    "from rlpost.recipes import eval as eval_recipe\nn = cfg.eval.every\nevaluate = 1\n"
    "class Config:\n  eval: int = 0\n"
  )
  hits = find_eval_exec([tmp_path])
  lines = sorted(h.split(": ")[0] for h in hits)
  bad, worse = tmp_path / "bad.py", tmp_path / "sub" / "worse.py"
  assert lines == sorted([f"{bad}:2", f"{bad}:4", f"{bad}:5", f"{bad}:6", f"{worse}:1"]), hits


# ---------------------------------------------------------------- format_number


@pytest.mark.parametrize(
  "x, text",
  [
    (24.0, "24"),
    (24, "24"),
    (-3, "-3"),
    (-3.0, "-3"),
    (0.5, "0.5"),
    (1 / 3, "0.333333"),
    (-2 / 3, "-0.666667"),
    (-0.0, "0"),
    (-1e-9, "0"),
    (1e6, "1000000"),
    (0.1 + 0.2, "0.3"),
    (2.9999999999, "3"),
  ],
)
def test_format_number(x, text):
  assert format_number(x) == text


# ---------------------------------------------------------------- parse_tool_call / run_tool


def test_parse_well_formed_call():
  text = "I need 48/2. <tool>calculator: 48/2</tool>"
  assert parse_tool_call(text) == ToolCall("calculator", "48/2")
  assert parse_tool_call("<tool> calculator :  1+1 </tool>") == ToolCall("calculator", "1+1")
  assert parse_tool_call("<tool>note: a: b</tool>") == ToolCall("note", "a: b")


def test_parse_takes_the_last_call():
  text = "<tool>calculator: 1</tool><result>1</result> then <tool>calculator: 2</tool>"
  assert parse_tool_call(text) == ToolCall("calculator", "2")


def test_parse_no_call_is_none():
  assert parse_tool_call("The answer is 24.") is None
  assert parse_tool_call("calculator: 48/2</tool>") is None


@pytest.mark.parametrize(
  "text, reason",
  [
    ("<tool>calculator: 48/2", "closing"),
    ("<tool>calculator 48/2</tool>", "NAME: ARGUMENT"),
    ("<tool>: 48/2</tool>", "no tool name"),
    ("<tool>two words: 1</tool>", "identifier"),
  ],
)
def test_parse_malformed_call_is_error(text, reason):
  result = parse_tool_call(text)
  assert isinstance(result, str) and result.startswith("error: ") and reason in result


def test_run_tool_calculator():
  assert run_tool(tools.REGISTRY, ToolCall("calculator", "48/2"), 200) == ("24", False)
  result, is_error = run_tool(tools.REGISTRY, ToolCall("calculator", "1/0"), 200)
  assert is_error and result.startswith("error: ")


def test_run_tool_unknown_lists_known_tools():
  result, is_error = run_tool(tools.REGISTRY, ToolCall("search", "x"), 200)
  assert is_error and result.startswith("error: ")
  assert "search" in result and "calculator" in result


def test_run_tool_raising_tool_is_an_error_not_an_exception():
  def broken(argument):
    raise RuntimeError(f"cannot handle {argument}")

  result, is_error = run_tool({"broken": broken}, ToolCall("broken", "x"), 200)
  assert is_error and result.startswith("error: ")
  assert "RuntimeError" in result and "cannot handle x" in result


def test_run_tool_non_str_result_is_an_error():
  result, is_error = run_tool({"num": lambda a: 42}, ToolCall("num", "x"), 200)
  assert is_error and result.startswith("error: ") and "int" in result


def test_run_tool_text_with_lone_surrogates_is_contained():
  """A tool returning (or raising with) text that holds a lone surrogate, as bytes decoded
  with errors='surrogateescape' do: an error result / an escaped message, both encodable.

  Mutation caught: no UTF-8 check in `_call` (the result reached the tokenizer and the
  rollout died with a UnicodeEncodeError naming neither the tool nor the environment).
  """
  bad = b"caf\xe9".decode("utf-8", "surrogateescape")

  def raises(argument):
    raise ValueError(f"cannot read {bad}")

  registry = {"cat": lambda a: bad, "raises": raises}
  result, is_error = run_tool(registry, ToolCall("cat", "x"), 200)
  assert is_error
  assert result == r"error: tool cat returned text that is not UTF-8 ('\udce9' at index 3)"
  result, is_error = run_tool(registry, ToolCall("raises", "x"), 200)
  assert is_error and result == r"error: tool raises failed: ValueError: cannot read caf\udce9"
  observation = with_tools(_fake_env([], {}), registry).step(0, "<tool>cat: x</tool>").observation
  observation.encode("utf-8")


@pytest.mark.parametrize("max_chars", [len(TRUNCATION_MARKER), 20, 50, 999])
def test_run_tool_clips_to_budget(max_chars):
  result, is_error = run_tool({"long": lambda a: "y" * 1000}, ToolCall("long", ""), max_chars)
  assert not is_error
  assert len(result) <= max_chars and result.endswith(TRUNCATION_MARKER)


def test_run_tool_short_result_is_not_clipped():
  assert run_tool({"echo": lambda a: a}, ToolCall("echo", "hi"), 20) == ("hi", False)


def test_budget_below_marker_is_rejected():
  with pytest.raises(ValueError, match="max_chars"):
    run_tool(tools.REGISTRY, ToolCall("calculator", "1"), len(TRUNCATION_MARKER) - 1)


# ---------------------------------------------------------------- with_tools


def _fake_env(calls: list, info: dict) -> Env:
  """An env of plain functions that records every inner step call in `calls`."""

  def reset(task, seed):
    return 0, "start"

  def step(state, text):
    calls.append((state, text))
    return Step(state + 1, "obs", 1.0, True, info)

  return Env("fake", reset, step, max_turns=3, stop_strings=("\n\n",))


def test_with_tools_tool_turn_keeps_state_and_skips_inner_step():
  calls = []
  env = with_tools(_fake_env(calls, {}))
  out = env.step(5, "Half of 48: <tool>calculator: 48/2</tool>")
  assert out == Step(5, "<result>24</result>", 0.0, False, {"tool_call": True, "tool_error": False})
  assert calls == []


def test_with_tools_failed_and_malformed_calls_are_tool_errors():
  calls = []
  env = with_tools(_fake_env(calls, {}))
  for text in [
    "<tool>calculator: 1/0</tool>",
    "<tool>search: cats</tool>",
    "<tool>calculator 1+1</tool>",
    "<tool>calculator: 1+1",
  ]:
    out = env.step(7, text)
    assert out.state == 7 and out.reward == 0.0 and not out.done, text
    assert out.info == {"tool_call": True, "tool_error": True}, text
    assert out.observation.startswith("<result>error: "), out.observation
    assert out.observation.endswith("</result>")
  assert calls == []


def test_with_tools_non_tool_turn_delegates_without_mutating_info():
  calls, inner_info = [], {"success": True}
  env = with_tools(_fake_env(calls, inner_info))
  out = env.step(5, "The answer is 24.")
  assert calls == [(5, "The answer is 24.")]
  assert out == Step(6, "obs", 1.0, True, {"success": True, "tool_call": False})
  assert inner_info == {"success": True}


def test_with_tools_takes_a_plain_tuple_step_and_passes_a_malformed_one_through():
  """The driver accepts any 5-tuple from step (`multiturn.checked_step`); so does the
  wrapper. A malformed inner result reaches the driver's check unchanged.

  Mutation caught: `inner._replace` on the raw result (a plain tuple or None failed with
  "AttributeError: ... no attribute '_replace'", reported as the environment raising).
  """
  from rlpost.envs import multiturn

  inner = _fake_env([], {})
  plain = inner._replace(step=lambda s, t: (s + 1, "obs", 1.0, True, {"k": 1}))
  assert with_tools(plain).step(5, "hi") == Step(6, "obs", 1.0, True, {"k": 1, "tool_call": False})
  for bad, match in [(None, "step returned NoneType"), ((1, "o", 0.0, True, []), "info is list")]:
    env = with_tools(inner._replace(step=lambda s, t, bad=bad: bad))
    assert env.step(0, "hi") is bad
    with pytest.raises(TypeError, match=match):
      multiturn.checked_step(env, 0, "hi")


def test_with_tools_clips_results():
  env = with_tools(_fake_env([], {}), registry={"long": lambda a: "z" * 500}, max_result_chars=30)
  out = env.step(0, "<tool>long: x</tool>")
  body = out.observation.removeprefix("<result>").removesuffix("</result>")
  assert len(body) <= 30 and body.endswith(TRUNCATION_MARKER)


def test_with_tools_keeps_env_fields_and_adds_stop_string_once():
  inner = _fake_env([], {})
  env = with_tools(inner)
  assert (env.name, env.reset, env.max_turns) == (inner.name, inner.reset, inner.max_turns)
  assert env.stop_strings == ("\n\n", CALL_CLOSE) and CALL_CLOSE == "</tool>"
  assert with_tools(env).stop_strings == ("\n\n", CALL_CLOSE)
  assert env.reset(None, 0) == (0, "start")


def test_with_tools_rejects_too_small_budget():
  with pytest.raises(ValueError, match="max_chars"):
    with_tools(_fake_env([], {}), max_result_chars=3)


@pytest.mark.parametrize(
  "fields,match",
  [
    ({"stop_strings": "\n\n"}, r"stop_strings='\\n\\n' must be a tuple of non-empty strings"),
    ({"stop_strings": ("",)}, r"stop_strings=\(''\,\) must be a tuple of non-empty strings"),
    ({"max_turns": 0}, r"max_turns=0 must be an integer >= 1"),
  ],
)
def test_with_tools_refuses_unusable_env_limits(fields, match):
  """Mutation caught: dropping `check_env` from `with_tools` (a bare-string stop_strings
  failed on a str + tuple concatenation; ("",) and max_turns=0 were taken silently)."""
  with pytest.raises(ValueError, match=match) as info:
    with_tools(_fake_env([], {})._replace(**fields))
  assert "'fake'" in str(info.value)


@pytest.mark.parametrize(
  "registry,match",
  [
    ({"web-search": lambda a: "x"}, r"name 'web-search' is not an identifier.*'web_search'"),
    ({"calc": "not a function"}, r"tool 'calc' is str, not a function"),
  ],
)
def test_with_tools_refuses_a_registry_entry_no_call_can_reach(registry, match):
  """Mutation caught: `with_tools` taking the registry unchecked (every call of
  "web-search" was answered "tool name must be an identifier"; a non-callable tool
  failed at each call with "'str' object is not callable")."""
  with pytest.raises(ValueError, match=match):
    with_tools(_fake_env([], {}), registry)
