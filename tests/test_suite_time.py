"""experiments.benchmarks.suite_time and suite_profile: what they read and how they sum it."""

import json

from conftest import import_main

suite_time = import_main("experiments.benchmarks.suite_time")

DURATIONS = """
============================= slowest durations ==============================
12.50s call     tests/test_a.py::test_long[x-1]
0.20s setup    tests/test_b.py::test_fixture_heavy
3.00s teardown tests/test_a.py::test_long[x-1]
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
2 passed in 16.11s
"""


def test_slowest_sorts_every_phase_by_seconds():
  """Mutation caught: sorting by the test name (the text) instead of the seconds."""
  rows = suite_time.slowest(DURATIONS, count=2)
  assert rows == [
    {"seconds": 12.5, "phase": "call", "test": "tests/test_a.py::test_long[x-1]"},
    {"seconds": 3.0, "phase": "teardown", "test": "tests/test_a.py::test_long[x-1]"},
  ]


def test_cpu_description_names_this_machines_cpu():
  info = suite_time.cpu_description()
  assert info["cores"] >= 1 and isinstance(info["avx512f"], bool)


def test_suite_profile_sums_per_module_and_per_program(tmp_path):
  """Mutations caught: a program's seconds counted once per name instead of summed; its
  compilations counted once per test instead of read from the record."""
  suite_profile = import_main("experiments.benchmarks.suite_profile")

  lines = [
    {
      "test": "tests/test_a.py::t1",
      "wall_s": 5.0,
      "cpu_s": 4.0,
      "compile_s": 3.0,
      "programs": {"jit_s": 2.0},
      "compiles": {"jit_s": 3},
    },
    {"test": "tests/test_a.py::t2", "wall_s": 1.0, "programs": {"jit_s": 0.5, "jit_f": 0.25}},
    {"test": "tests/test_b.py::t3", "wall_s": 2.0, "trace_s": 0.5},
  ]
  (tmp_path / "gw0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
  (tmp_path / "gw1.jsonl").write_text(json.dumps(lines[2]) + "\n")
  out = suite_profile.summarize(suite_profile.read_records(str(tmp_path)), top=2)
  assert out["tests"] == 3 and out["totals"]["wall_s"] == 8.0 and out["totals"]["trace_s"] == 0.5
  assert list(out["modules"]) == ["tests/test_a.py", "tests/test_b.py"]
  assert out["modules"]["tests/test_a.py"]["tests"] == 2
  assert out["modules"]["tests/test_a.py"]["compile_s"] == 3.0
  assert out["totals"]["cpu_s"] == 4.0 and out["totals"]["child_cpu_s"] == 0.0
  assert out["programs"] == {
    "jit_s": {"compile_s": 2.5, "programs": 4},
    "jit_f": {"compile_s": 0.2, "programs": 1},
  }
  assert [r["test"] for r in out["slowest"]] == ["tests/test_a.py::t1", "tests/test_b.py::t3"]


def test_a_codegen_option_xla_rejects_is_left_out_of_every_setting(monkeypatch):
  """A later XLA may drop an option of `FAST_CODEGEN` (the older fusion emitters): passed
  with each compilation it would fail every test ("No such compile option"), so
  `conftest` leaves it out. Mutation caught: the rejected option kept in any setting."""
  import conftest

  known = dict(conftest.FAST_CODEGEN)
  monkeypatch.setitem(conftest.FAST_CODEGEN, "xla_no_such_option", True)
  monkeypatch.setitem(conftest.CONTRACTING_CODEGEN, "xla_no_such_option", True)
  monkeypatch.setitem(conftest.DEFAULT_CODEGEN, "xla_no_such_option", False)
  conftest._drop_rejected_options()  # pylint: disable=protected-access
  assert conftest.FAST_CODEGEN == known
  assert "xla_no_such_option" not in conftest.CONTRACTING_CODEGEN
  assert "xla_no_such_option" not in conftest.DEFAULT_CODEGEN
