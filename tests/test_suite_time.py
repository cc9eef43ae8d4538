"""experiments.benchmarks.suite_time: what it reads from pytest's output and /proc/cpuinfo."""

from experiments.benchmarks import suite_time

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
