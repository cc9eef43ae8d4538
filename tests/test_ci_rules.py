"""The CI rule: without ../shared a test skips with its reason, unless RLPOST_REQUIRE_SHARED=1."""

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

_PROBE = """
import pathlib
from conftest import require_shared
def test_needs_shared():
  require_shared(pathlib.Path("/nonexistent/shared/fixtures"))
"""


@pytest.mark.parametrize("require,outcome", [("", "1 skipped"), ("1", "1 failed")])
def test_missing_shared_skips_or_fails(require, outcome, tmp_path):
  probe = tmp_path / "test_probe.py"
  probe.write_text(_PROBE)
  env = {**os.environ, "RLPOST_REQUIRE_SHARED": require, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-rs",
      "-p",
      "no:cacheprovider",
      f"--rootdir={tmp_path}",
      "-c",
      os.devnull,
      str(probe),
    ],
    cwd=REPO_ROOT,
    env={**env, "PYTHONPATH": str(REPO_ROOT / "tests")},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert outcome in out.stdout, out.stdout[-2000:]
  assert "/nonexistent/shared/fixtures not found" in out.stdout


def test_ci_runs_exactly_the_readme_test_command():
  """`.ci/run` ends with README's set-up-and-test line, word for word (CI's command is
  the one users are told to run).

  Mutation caught: a flag (e.g. `--dist loadscope`) added to one and not the other."""
  readme = (REPO_ROOT / "README.md").read_text()
  ci = (REPO_ROOT / ".ci" / "run").read_text()
  line = next(l for l in readme.splitlines() if "pip install -q -e" in l and "pytest" in l)
  assert line in ci.splitlines(), (line, ci)
