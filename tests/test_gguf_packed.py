"""GGUF Q4 blocks kept packed (rlpost.models.weights.gguf_packed): the JAX dequantisation
of the packed bytes equals `gguf.quants.dequantize` (llama.cpp's formulas) bit for bit,
on random blocks and on every packed tensor of the shipped files."""

import gguf
import numpy as np
import pytest
from conftest import skip_or_fail
from test_weights import TINY_INFO, gguf_tensors, random_params, write_gguf

from rlpost.models import quant4
from rlpost.models.weights import gguf as gguf_loader
from rlpost.models.weights import gguf_file, gguf_packed, packaged

Q = gguf.GGMLQuantizationType


def _random_raw(qtype, rows: int, cols: int, seed: int) -> np.ndarray:
  """Stored bytes [rows, row_bytes] of random blocks: every byte random, then the float16
  fields (d; Q4_1's m; Q4_K's d and dmin) set to finite values of both signs."""
  rng = np.random.default_rng(seed)
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  blocks = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
  fields = 1 if qtype == Q.Q4_0 else 2
  f16 = rng.uniform(-2.0, 2.0, (rows, cols // block, fields)).astype(np.float16)
  blocks[..., : 2 * fields] = f16.view(np.uint8).reshape(rows, cols // block, 2 * fields)
  return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_random_blocks_dequantise_bit_exactly(qtype):
  """Mutations caught: Q4_K's high scale bits taken from the mins' bytes (`(high >> 6)`
  for `(low >> 6)` in `_k4_scales`); Q4_0's shift -7 d; the Q4_K sub-block pairs swapped
  (`a[..., 1 - k :: 2]`)."""
  raw = _random_raw(qtype, 6, 768, int(qtype))
  want = gguf.quants.dequantize(raw, qtype)
  packed = gguf_packed.from_raw(raw, qtype)
  assert packed.codes.shape == (6, 384) and packed.shape == (768, 6)
  got = np.asarray(quant4.dequantize(packed)).T
  np.testing.assert_array_equal(got, want)
  assert packed.nbytes <= raw.nbytes * 1.1  # the layout is kept (Q4_K: 16 bytes per 256)


def test_unpacked_types_are_refused():
  with pytest.raises(ValueError, match="Q8_0 is not kept packed"):
    gguf_packed.from_raw(np.zeros((1, 34), np.uint8), Q.Q8_0)


def _smollm2_path():
  try:
    return packaged.smollm2_gguf_path()
  except ImportError as e:
    skip_or_fail(str(e))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_load_gguf_packed_keeps_the_q4_stacks(tmp_path, qtype):
  """A tiny Gemma 3 GGUF with Q4 layer matrices: `load_gguf(packed=True)` returns them as
  Packed4 stacks [L, ...] equal, dequantised, to what `load_gguf` returns; the rest as
  before. Mutation caught: `_packed_stacks` keeping the first layer's tensor for all."""
  info = dict(TINY_INFO, embed_dim=64, mlp_dim=128, head_dim=32)
  tensors = gguf_tensors(random_params(info, seed=2), info)
  qtypes = {n: Q[qtype] for n, a in tensors.items() if a.ndim == 2 and n.startswith("blk")}
  path = write_gguf(tmp_path / "q4.gguf", tensors, info, qtypes=qtypes)
  floats, _ = gguf_loader.load_gguf(path)
  packed, _ = gguf_loader.load_gguf(path, packed=True)
  for name in ("q", "k", "v", "o", "gate", "up", "down"):
    w = packed["layers"][name]
    assert isinstance(w, quant4.Packed4) and w.fmt == qtype.lower(), name
    assert w.shape == floats["layers"][name].shape
    np.testing.assert_array_equal(quant4.dequantize(w), floats["layers"][name], err_msg=name)
  np.testing.assert_array_equal(packed["embed"], floats["embed"])
  np.testing.assert_array_equal(packed["layers"]["attn_norm"], floats["layers"]["attn_norm"])


def _shipped(which):
  try:
    return packaged.smollm2_gguf_path() if which == "smollm2" else packaged.default_gguf_path()
  except ImportError as e:
    skip_or_fail(str(e))


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_shipped_files_packed_stacks_equal_gguf_dequantize(which):
  """Every packed stack of the shipped files (SmolLM2: every matrix, Q4_1, q/k rows
  un-permuted; Gemma 3 Q4_K_M: the all-Q4_K `o` stack; its `down`, Q4_K in some layers
  and Q6_K in others, stays float) dequantises to `gguf.quants.dequantize` of each
  layer's tensor (rows un-permuted, transposed) exactly.
  Mutation caught: `take_rows` skipped in `gguf._packed_stacks` (q/k rows in llama.cpp's
  order)."""
  gf = gguf_file.read_gguf(_shipped(which))
  family = gguf_loader.family_of(gf)
  config = family.config(**family.weights.gguf_info(gf, family))
  kinds = gguf_loader.tensor_kinds(family, config)
  stacks, _ = gguf_loader._packed_stacks(gf, kinds)  # pylint: disable=protected-access
  want_kept = {"q", "k", "v", "o", "gate", "up", "down"} if which == "smollm2" else {"o"}
  assert set(stacks) == want_kept
  fmt = {"smollm2": "q4_1", "gemma3": "q4_k"}[which]
  for name, path, kind in kinds:
    if path[0] != "layers" or path[1] not in stacks:
      continue
    want = gf.dequantize(name)
    if kind.startswith("rope_rows:"):
      want = gguf_loader.unpermute_rope_rows(want, int(kind.split(":")[1]))
    w = stacks[path[1]]
    assert w.fmt == fmt
    layer = quant4.Packed4(w.codes[path[2]], {k: v[path[2]] for k, v in w.scales.items()}, fmt)
    np.testing.assert_array_equal(np.asarray(quant4.dequantize(layer)), want.T, err_msg=name)
