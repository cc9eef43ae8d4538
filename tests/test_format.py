"""One formatter for the whole tree: `ruff format` (settings in pyproject.toml) changes nothing."""

import importlib.util
import subprocess
import sys

from conftest import REPO_ROOT, skip_or_fail


def test_tree_is_ruff_formatted():
  if importlib.util.find_spec("ruff") is None:
    skip_or_fail("ruff is not installed: pip install -e '.[dev]'")
  out = subprocess.run(
    [sys.executable, "-m", "ruff", "format", "--check", "."],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, (
    "files need formatting; run `ruff format .` in the repository root:\n" + out.stdout[-3000:]
  )
