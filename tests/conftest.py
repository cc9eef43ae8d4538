"""Shared test set-up: strict numerics, paths to ../shared, and skip rules."""
import os
import pathlib

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
