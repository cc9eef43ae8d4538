"""Process-wide settings of the experiment mains (rlpost.train.runtime): the compilation
cache's machine key, quiet checkpoint logs, and both in a real run."""

import logging
import re

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
  read_only = logging.LogRecord(
    "absl",
    logging.WARNING,
    "/x/orbax/checkpoint/checkpoint_manager.py",
    1,
    "Given directory is read only=%s",
    ("/run",),
    None,
  )
  assert not keep(read_only)  # another run's checkpoints are opened read only on purpose
  assert keep(record("/x/rlpost/train/checkpoint.py", logging.WARNING))


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


# Warnings a clean start may print: each names the setting that removes it.
ACTIONABLE = ("vm.max_map_count=",)
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] (.*)$")
_OURS = {p.name for d in ("rlpost", "experiments") for p in (REPO_ROOT / d).rglob("*.py")}


def unexpected_lines(output: str) -> list[str]:
  """The lines of a run's log that are noise to its user: a traceback or a warning text, a
  warning that names no setting (ACTIONABLE), any log line from another library's file."""
  bad = []
  for line in output.replace("\r", "\n").splitlines():
    if re.search(r"Traceback|Warning|warning:|Exception|Event loop", line):
      bad.append(line)
    elif match := _ABSL_LINE.match(line.strip()):
      level, source, text = match.groups()
      if source not in _OURS or (level != "I" and not text.startswith(ACTIONABLE)):
        bad.append(line)
  return bad


def test_the_noise_check_flags_what_issue_71_saw():
  optax_line = (
    "I1206 07:29:57.046548 140472197176192 _schedule.py:127] A polynomial schedule was set "
    "with a non-positive `transition_steps` value; this results in a constant schedule"
  )
  orbax_line = "W1206 07:29:56.821089 1404 checkpoint_manager.py:849] Given directory is read only"
  ours = "I1206 07:30:28.845129 1398 rl.py:584] dynamic sampling: 2 of 4 groups with signal"
  mapped = "W1206 07:30:45.936074 1398 runtime.py:118] vm.max_map_count=65530: raise it"
  log = "\n".join([optax_line, orbax_line, ours, mapped, "RuntimeError: Event loop is closed"])
  assert unexpected_lines(log) == [optax_line, orbax_line, "RuntimeError: Event loop is closed"]


TINY_RECIPES = [
  ("experiments.grpo", "grpo_gsm8k.py:tiny"),
  ("experiments.ppo", "ppo_gsm8k.py:tiny"),
  ("experiments.agentic", "agentic.py:frozenlake_tiny"),
  ("experiments.agentic", "agentic.py:frozenlake_tiny,ppo"),
  ("experiments.sft", "sft.py:tiny"),
  ("experiments.dpo", "dpo.py:tiny"),
  ("experiments.reward_model", "reward_model.py:tiny"),
]


@pytest.mark.slow
def test_tiny_recipes_start_and_end_without_noise(tmp_path):
  """Issue 71: each tiny recipe through its main, 3 steps (a warm-up of 0 steps, which
  optax logged as a misconfiguration), then the same command again for GRPO and SFT (it
  resumes from the last checkpoint; every recipe restores through `train/checkpoint.py`),
  then a GRPO run started from a finished run's weights (`init_from`: orbax opens that run
  read only): exit status 0 and no line `unexpected_lines` flags. The SFT run also fills
  the compilation cache's machine-keyed directory (`--compilation_cache_dir`) and shows its
  progress bar; its resume asks for the checkpoint library's INFO lines and turns the cache
  off (said at --verbosity=1), writing nothing to it. One process start for the runs
  (tests/cli_batch.py). Mutation caught: make_optimizer building a zero-length warm-up
  again. Over 20 s (about 50 s on 2 cores): 10 runs of 7 mains, each compiling its own
  programs; the logs are what a user sees, so they go through the mains."""
  from conftest import run_clis  # pylint: disable=g-import-not-at-top

  cache, sft = tmp_path / "cache", 4  # TINY_RECIPES' index of SFT
  cases, loud = [], len(TINY_RECIPES) + 1
  for n, i in enumerate([*range(len(TINY_RECIPES)), 0, sft]):
    main, config = TINY_RECIPES[i]
    flags = ["--config.train.steps=3", "--config.checkpoint.every=1"]
    if i == sft:
      flags += (
        [f"--compilation_cache_dir={cache}"]
        if n < loud
        else [
          "--checkpoint_info_logs",
          "--compilation_cache_dir=",
          "--verbosity=1",
        ]
      )
    cases.append(
      [main, [f"--config=experiments/configs/{config}", *flags, f"--workdir={tmp_path / str(i)}"]]
    )
  init = [f"--config.model.init_from={tmp_path / '0'}", "--config.train.steps=1"]
  cases.append(
    [
      "experiments.grpo",
      [
        f"--config=experiments/configs/{TINY_RECIPES[0][1]}",
        *init,
        f"--workdir={tmp_path / 'init'}",
      ],
    ]
  )
  runs = run_clis(cases, timeout=600)
  (keyed,) = cache.iterdir()  # the quiet SFT run filled the machine-keyed directory
  assert keyed.name == runtime.machine_key() and any(keyed.iterdir())
  assert "sft: 100%" in runs[sft][1]
  status, output = runs[loud]
  assert status == 0 and "checkpoint_manager.py" in output, output[-2000:]
  assert "compilation cache: off" in output
  failures = []
  for n, ((main, args), (status, output)) in enumerate(zip(cases, runs)):
    if n != loud and (status != 0 or unexpected_lines(output)):
      failures.append(f"{main} {args}: status {status}\n" + "\n".join(unexpected_lines(output)))
      failures[-1] += "" if unexpected_lines(output) else output[-2000:]
  assert not failures, "\n\n".join(failures)
