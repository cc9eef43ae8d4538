"""Targets that tests/test_bounded.py runs in `rlpost.rewards.bounded`'s worker processes."""

import os
import time

_setups = 0


def counted_setup(sleep_s: float) -> int:
  """A setup that takes `sleep_s` and returns how many setups this worker ran."""
  global _setups
  time.sleep(sleep_s)
  _setups += 1
  return _setups


def with_setup(setups: int, x: int) -> tuple[int, int, int]:
  return setups, x, os.getpid()


def hang(pid_path: str) -> None:
  """Writes this worker's pid, then computes a number that never finishes (C code)."""
  with open(pid_path, "w", encoding="utf-8") as f:
    f.write(str(os.getpid()))
  return 9**9**9**9  # pylint: disable=expression-not-assigned
