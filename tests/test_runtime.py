"""Process-wide settings of the experiment mains (rlpost.train.runtime): the compilation
cache's machine key, quiet checkpoint logs, and both in a real run."""

import logging
import subprocess
import sys

import jax
import pytest

from conftest import REPO_ROOT
from rlpost import errors
from rlpost.train import runtime

XEON = "model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
EPYC = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2\n"


def test_the_cache_key_separates_cpus_and_jax_versions_not_flag_order(monkeypatch):
  """Mutation caught: a key without the CPU's feature flags (two models with the same
  name but different instructions would share compiled programs)."""
  xeon, epyc = runtime.machine_key(XEON), runtime.machine_key(EPYC)
  assert xeon != epyc and jax.__version__ in xeon
  fewer_flags = XEON.replace(" avx512_bf16", "")
  assert runtime.machine_key(fewer_flags) != xeon
  reordered = XEON.replace("fpu sse avx2", "avx2 fpu sse")
  assert runtime.machine_key(reordered) == xeon
  monkeypatch.setattr(jax, "__version__", "0.0.1")
  assert runtime.machine_key(XEON) != xeon


def test_checkpoint_library_info_is_dropped_and_nothing_else():
  record = lambda path, level: logging.LogRecord("absl", level, path, 1, "m", None, None)
  keep = runtime.QUIET_CHECKPOINTS.filter
  assert not keep(record("/x/site-packages/orbax/checkpoint/manager.py", logging.INFO))
  assert keep(record("/x/site-packages/orbax/checkpoint/manager.py", logging.WARNING))
  assert keep(record("/x/rlpost/recipes/sft.py", logging.INFO))


def _sft(tmp_path, name, *flags):
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.sft",
      "--config=experiments/configs/sft.py:tiny",
      "--config.train.steps=2",
      "--config.checkpoint.every=1",
      f"--workdir={tmp_path / name}",
      *flags,
    ],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  return run.stderr


@pytest.mark.slow
def test_runs_are_quiet_and_fill_the_cache_by_default(tmp_path):
  """A default run: no checkpoint-library INFO line, the progress bar still shown, and
  compiled programs in the cache's machine-keyed directory; asked for, the INFO lines
  come back, and an empty cache directory turns the cache off (said at --verbosity=1)."""
  cache = tmp_path / "cache"
  quiet = _sft(tmp_path, "quiet", f"--compilation_cache_dir={cache}")
  assert "checkpoint_manager.py" not in quiet and "sft: 100%" in quiet
  (keyed,) = cache.iterdir()
  assert keyed.name == runtime.machine_key() and any(keyed.iterdir())
  before = sorted(p.name for p in keyed.iterdir())
  loud = _sft(
    tmp_path, "loud", "--checkpoint_info_logs", "--compilation_cache_dir=", "--verbosity=1"
  )
  assert "checkpoint_manager.py" in loud and "compilation cache: off" in loud
  assert sorted(p.name for p in keyed.iterdir()) == before


@pytest.mark.parametrize("max_gb", [0.0, -1.0, float("inf"), float("nan")])
def test_a_cache_cap_that_is_not_a_finite_positive_size_is_a_flag_error(max_gb, tmp_path):
  """Mutation caught: the check `max_gb > 0` alone lets inf through to int(inf * 2**30)
  (OverflowError, a traceback)."""
  with pytest.raises(errors.FlagError, match="--compilation_cache_max_gb="):
    runtime.enable_compilation_cache(str(tmp_path), max_gb)


def test_a_cache_directory_that_cannot_be_made_turns_the_cache_off(tmp_path, caplog):
  """The cache only saves time: a path under a file runs without it, saying so."""
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  before = jax.config.jax_compilation_cache_dir
  with caplog.at_level(logging.WARNING):
    assert runtime.enable_compilation_cache(str(blocker / "cache"), 1.0) is None
  assert "running without the compilation cache" in caplog.text
  assert jax.config.jax_compilation_cache_dir == before


def test_a_low_memory_map_limit_warns_with_the_fix(tmp_path, caplog):
  """Linux's default vm.max_map_count (65530) warns, naming the sysctl that raises it; the
  wanted limit does not; an unreadable file is no limit. Mutation caught: the comparison
  the wrong way round."""
  path = tmp_path / "max_map_count"
  path.write_text("65530\n")
  with caplog.at_level(logging.WARNING):
    assert runtime.check_map_count(str(path)) == 65530
  assert "sysctl -w vm.max_map_count=262144" in caplog.text
  caplog.clear()
  path.write_text("262144\n")
  with caplog.at_level(logging.WARNING):
    assert runtime.check_map_count(str(path)) == 262144
  assert not caplog.text
  assert runtime.check_map_count(str(tmp_path / "absent")) is None
