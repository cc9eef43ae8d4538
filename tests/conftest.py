"""Shared test set-up: strict numerics, paths to ../shared, and skip rules."""
import os
import pathlib
import tempfile

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("RLPOST_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "gemma3_270m"
GSM8K_DIR = SHARED / "data" / "gsm8k"


def require_shared(path: pathlib.Path) -> pathlib.Path:
  """Skips the calling test, with the reason, when `path` under ../shared is absent."""
  if not path.exists():
    pytest.skip(f"{path} not found: reference data lives in ../shared beside the clone "
                "(set RLPOST_SHARED to point elsewhere)")
  return path

# Identical programs (each experiment run re-jits the same step functions) are
# compiled once per test session: a persistent cache in a session directory,
# shared with the subprocesses the tests start.
_CACHE_DIR = os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rlpost_test_jax_cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
