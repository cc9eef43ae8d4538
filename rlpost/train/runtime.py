"""Process-wide settings every experiment applies at start: JAX's persistent compilation
cache (a resumed run reuses the compiled programs of the run before it), quiet
checkpoint-library logs, and a warning when the kernel's memory-map limit is low.

The cache lives in DIRECTORY/<machine key>: the key names the JAX and jaxlib versions,
the backend and a digest of the CPU model and its feature flags, so an entry is never
reused by another JAX or on a CPU that may lack an instruction the program uses. JAX
evicts the least recently used entries beyond the size cap.
"""

import hashlib
import logging
import math
import os
import platform

import jax

from rlpost import errors

CHECKPOINT_LIBRARIES = ("orbax",)  # their INFO lines are dropped unless asked for
# Their warnings about a choice this library makes on purpose (another run's checkpoints
# are opened read only), dropped too: nothing in them for a user to change.
CHOSEN_LIBRARY_WARNINGS = ("Given directory is read only",)


def read_cpuinfo() -> str:
  """/proc/cpuinfo's text ("" where there is none: another OS)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return f.read()
  except OSError:
    return ""


def cpu_signature(cpuinfo: str | None = None) -> str:
  """The CPU model and feature flags (from /proc/cpuinfo where there is one)."""
  cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
  fields = {}
  for line in cpuinfo.splitlines():
    name, _, value = line.partition(":")
    name = name.strip()
    if name in ("model name", "flags", "Features", "CPU part") and name not in fields:
      fields[name] = (
        " ".join(sorted(value.split())) if name in ("flags", "Features") else value.strip()
      )
  return "|".join(f"{k}={v}" for k, v in sorted(fields.items())) or platform.processor()


def machine_key(cpuinfo: str | None = None) -> str:
  """`jax-<version>_jaxlib-<version>_<backend>_<digest of the CPU signature>`."""
  import jaxlib

  digest = hashlib.sha256(cpu_signature(cpuinfo).encode()).hexdigest()[:12]
  return f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_{jax.default_backend()}_{digest}"


def enable_compilation_cache(directory: str, max_gb: float) -> str | None:
  """Turns JAX's persistent compilation cache on in `directory`/<machine key>, capped at
  `max_gb`; returns that path, or None when `directory` is "" (off)."""
  if not directory:
    return None
  if not (math.isfinite(max_gb) and max_gb > 0):
    raise errors.FlagError(f"--compilation_cache_max_gb={max_gb}: use a finite positive size in GB")
  path = os.path.join(os.path.expanduser(directory), machine_key())
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:  # a cache is an optimisation: run without it rather than stop
    logging.warning(
      "--compilation_cache_dir=%s: cannot create %s (%s); running without the compilation "
      "cache (pass a writable directory, or '' to turn it off)",
      directory,
      path,
      e.strerror or e,
    )
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_compilation_cache_max_size", int(max_gb * 2**30))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program: the
  # many small ones (< 0.5 s each) were 14% of a real-model GRPO start's compile time
  return path


class _DropLibraryInfo(logging.Filter):
  """Drops records below WARNING logged from a checkpoint library's source files, and its
  warnings about this library's own choices (CHOSEN_LIBRARY_WARNINGS)."""

  def filter(self, record: logging.LogRecord) -> bool:
    path = record.pathname.replace("\\", "/")
    if not any(f"/{name}/" in path for name in CHECKPOINT_LIBRARIES):
      return True
    if record.levelno >= logging.WARNING:
      return not str(record.msg).startswith(CHOSEN_LIBRARY_WARNINGS)
    return False


QUIET_CHECKPOINTS = _DropLibraryInfo()


def quiet_checkpoint_logs() -> None:
  """Checkpoint-library INFO lines off (warnings, errors and every other log unaffected)."""
  from absl import logging as absl_logging

  for logger in (logging.getLogger(), logging.getLogger("absl")):
    logger.addFilter(QUIET_CHECKPOINTS)
  absl_logging.get_absl_handler().addFilter(QUIET_CHECKPOINTS)


MAP_COUNT_PATH = "/proc/sys/vm/max_map_count"
MAP_COUNT_WANTED = 262144


def check_map_count(path: str = MAP_COUNT_PATH) -> int | None:
  """Warns when the kernel's limit on a process's memory maps is below MAP_COUNT_WANTED;
  returns the limit (None where there is none to read).

  XLA:CPU maps three or more sections per compiled program and JAX keeps every program it
  compiled: a multi-turn run, whose rollouts compile one program per cache and row shape,
  reached Linux's default 65530 maps after ~30 minutes of a real-model FrozenLake run and
  aborted with "LLVM ERROR: Unable to allocate section memory".
  """
  try:
    with open(path, encoding="utf-8") as f:
      limit = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  if limit < MAP_COUNT_WANTED:
    logging.warning(
      "vm.max_map_count=%d: a long run that compiles many programs (multi-turn rollouts) "
      "can exhaust it and abort with 'LLVM ERROR: Unable to allocate section memory'; "
      "raise it with `sudo sysctl -w vm.max_map_count=%d`",
      limit,
      MAP_COUNT_WANTED,
    )
  return limit
