"""The real Gemma 3 270M, loaded once per test process and shared by every test module.

Loading dequantizes the packaged Q4_K_M GGUF (~10 s on the 2-core CI machine); a
pytest-xdist worker that runs real-model tests of several modules pays it once. The
float32 params are only read: the recipe runs given them train LoRA adapters (their
donated train state holds the adapters, never the base weights), so sharing them cannot
change a result.
"""

import functools

from conftest import require_gemma3


@functools.lru_cache(maxsize=1)
def _load():
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top

  return loading.load_model("gemma3_270m", "gguf")


def gemma3_270m():
  """(gemma3.Config, float32 params, Tokenizer) of the packaged GGUF; skips without it."""
  require_gemma3()
  return _load()


def loaded_for(cfg):
  """The shared model as a recipe's `loaded=` argument, after checking that `cfg.model`
  names exactly what `common.load_model(cfg)` would have loaded from it, and that the run
  trains LoRA adapters (a full fine-tune would donate, so delete, the shared params)."""
  m = cfg.model
  got = (m.preset, m.weights, m.path, m.dtype, m.get("init_from") or "", cfg.lora.enabled)
  assert got == ("gemma3_270m", "gguf", "", "float32", "", True), got
  return gemma3_270m()
