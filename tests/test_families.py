"""Model families: Llama / Qwen2 / Qwen3 forwards, weight maps and tokenizers against
transformers (`tests/fixtures/families/`, made by `experiments/oracles/hf_families.py`)."""

import dataclasses
import functools
import json
import pathlib

import chex
import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import skip_or_fail
from rlpost import errors
from rlpost.models import decoder, families, llama, loading, lora, quant
from rlpost.models.weights import gguf as gguf_loader
from rlpost.models.weights import gguf_file, llama_names, packaged
from rlpost.models.weights import safetensors as st
from rlpost.ops.masks import causal_attention_mask
from rlpost.text import bpe, chat_formats, vocabularies

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "families"
TINY = ("llama", "qwen2", "qwen3")


def _tiny(family):
  """(Config, params, fixture) of the tiny transformers model of `family`."""
  path = FIXTURES / "tiny" / family
  params, info = st.load_hf_checkpoint(path)
  return (
    families.config_from_info(info),
    jax.tree.map(jnp.asarray, params),
    np.load(path / "logits.npz"),
  )


@functools.partial(jax.jit, static_argnames="config")
def _logits(params, ids_BxT, config):
  B, T = ids_BxT.shape
  logits, _ = decoder.forward(
    params,
    ids_BxT,
    jnp.broadcast_to(jnp.arange(T), (B, T)),
    causal_attention_mask(jnp.ones((B, T), bool)),
    config=config,
  )
  return logits


def _forward(params, ids_BxT, config) -> np.ndarray:
  """Logits [B, T, V] float32 of the training forward (positions 0..T-1, causal)."""
  return np.asarray(_logits(params, jnp.asarray(ids_BxT), config))


@pytest.mark.parametrize("family", TINY)
def test_tiny_hf_checkpoints_give_transformers_logits(family):
  """A Llama 3 (RoPE scaling, untied output), Qwen2 (q/k/v biases, tied) and Qwen3 (q/k
  head norms, untied) model saved by transformers loads as its tiny preset and gives
  transformers' float32 logits within 1e-4 (measured: 2e-7).

  Mutations caught: the q/k/v biases dropped; the Qwen3 head norms skipped or read with
  Gemma's (1 + w); Llama 3's RoPE divisors not applied; the untied output read from the
  embedding; SiLU replaced by tanh GELU.
  """
  config, params, fixture = _tiny(family)
  assert config == families.get_config(f"{family}_tiny")
  got = _forward(params, fixture["input_ids"], config)
  np.testing.assert_allclose(got, fixture["logits"], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", TINY)
def test_cached_unstacked_decoding_with_adapters_equals_the_full_forward(family):
  """Prefill then token-by-token decoding from the sampler's layout (unrolled layers, fused
  q/k/v and gate/up, biases kept apart) with unmerged LoRA adapters gives the training
  forward's logits, and the int8 sampler copy projects with the untied output.

  Mutations caught: unstack_layers fusing the biases away; the int8 "unembed" built from
  the embedding of an untied model.
  """
  config, params, fixture = _tiny(family)
  lcfg = lora.LoraConfig(rank=2, alpha=4.0)
  adapters = jax.tree.map(lambda x: x + 0.05, lora.init_adapters(jax.random.key(1), params, lcfg))
  tokens = jnp.asarray(fixture["input_ids"][:, :12])
  B, T = tokens.shape
  full, _ = decoder.forward(
    params,
    tokens,
    jnp.broadcast_to(jnp.arange(T), (B, T)),
    causal_attention_mask(jnp.ones((B, T), bool)),
    config=config,
    adapters=adapters,
    lora_scale=lcfg.scale,
  )
  step = jax.jit(
    lambda p, tok, pos, m, c: decoder.forward(
      p, tok, pos, m, c, config=config, adapters=adapters, lora_scale=lcfg.scale
    )
  )
  layout = decoder.unstack_layers(params)
  slots = jnp.arange(T)
  cache = decoder.init_cache(config, B, T)
  mask = jnp.broadcast_to((slots[None] <= jnp.arange(4)[:, None])[None], (B, 4, T))
  logits, cache = step(layout, tokens[:, :4], jnp.broadcast_to(jnp.arange(4), (B, 4)), mask, cache)
  outs = [logits]
  for t in range(4, T):
    mask = jnp.broadcast_to((slots <= t)[None, None], (B, 1, T))
    logits, cache = step(layout, tokens[:, t : t + 1], jnp.full((B, 1), t), mask, cache)
    outs.append(logits)
  chex.assert_trees_all_close(jnp.concatenate(outs, 1), full, atol=1e-4, rtol=1e-4)
  hidden = jax.random.normal(jax.random.key(2), (3, config.embed_dim))
  want = np.asarray(decoder.vocab_major_logits(params, hidden))
  got = np.asarray(decoder.vocab_major_logits(quant.quantize_for_sampling(params), hidden))
  assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def _llama_cpp_permute(w_OxI: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp convert_hf_to_gguf.py's q/k row order for its interleaved RoPE (written
  from its description: within a head, row pairs (i, i + hd/2) become neighbours)."""
  out, hd = w_OxI.shape[0], w_OxI.shape[0] // heads
  rows = [
    h * hd + j + half * (hd // 2) for h in range(heads) for j in range(hd // 2) for half in (0, 1)
  ]
  assert len(rows) == out
  return w_OxI[rows]


def _write_family_gguf(path, family, params, config):
  """A GGUF of `params` as llama.cpp's converter writes a `family` model (F32 tensors)."""
  w = gguf.GGUFWriter(str(path), family)
  w.add_context_length(512)
  w.add_embedding_length(config.embed_dim)
  w.add_block_count(config.num_layers)
  w.add_feed_forward_length(config.mlp_dim)
  w.add_head_count(config.num_heads)
  w.add_head_count_kv(config.num_kv_heads)
  w.add_key_length(config.head_dim)
  w.add_value_length(config.head_dim)
  w.add_rope_dimension_count(config.head_dim)
  w.add_rope_freq_base(config.rope_base)
  w.add_layer_norm_rms_eps(config.rms_eps)
  p = jax.tree.map(np.asarray, params)
  w.add_tensor("token_embd.weight", p["embed"])
  w.add_tensor("output_norm.weight", p["final_norm"])
  if "output" in p:
    w.add_tensor("output.weight", p["output"])
  if config.rope_freq_factors is not None:
    w.add_tensor("rope_freqs.weight", np.asarray(config.rope_freq_factors, np.float32))
  names = {"attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "q_norm": "attn_q_norm"}
  names.update(k_norm="attn_k_norm", q="attn_q", k="attn_k", v="attn_v", o="attn_output")
  names.update(gate="ffn_gate", up="ffn_up", down="ffn_down")
  heads = {"q": config.num_heads, "k": config.num_kv_heads}
  for i in range(config.num_layers):
    for leaf, stack in p["layers"].items():
      x = stack[i]
      if leaf.endswith("_bias"):
        w.add_tensor(f"blk.{i}.{names[leaf[:-5]]}.bias", x)
        continue
      if x.ndim == 2:
        x = np.ascontiguousarray(x.T)
        if family == "llama" and leaf in heads:
          x = _llama_cpp_permute(x, heads[leaf])
      w.add_tensor(f"blk.{i}.{names[leaf]}.weight", x)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.mark.parametrize("family", TINY)
def test_gguf_of_each_family_loads_the_same_weights_as_its_hf_checkpoint(family, tmp_path):
  """A GGUF written the way llama.cpp converts each family (Llama: q/k rows permuted for
  its interleaved RoPE, Llama 3 scaling as the rope_freqs tensor; Qwen2: biases; Qwen3:
  head norms) loads bitwise into the params the HF checkpoint gives, with the same config.

  Mutation caught: the q/k rows of a llama GGUF kept in llama.cpp's order (the test's
  permutation is written from llama.cpp's description, not from the loader's inverse).
  """
  config, params, _ = _tiny(family)
  loaded, info = gguf_loader.load_gguf(
    _write_family_gguf(tmp_path / "m.gguf", family, params, config)
  )
  assert info["rms_eps"] == float(np.float32(config.rms_eps))  # GGUF stores a float32
  assert families.config_from_info({**info, "rms_eps": config.rms_eps}) == config
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, params), loaded)


@pytest.mark.parametrize("family", TINY)
def test_hf_export_round_trips_each_family(family, tmp_path):
  """export_hf_checkpoint writes the family's config.json and tensor names (lm_head when
  untied, biases, head norms); loading it gives the same params and config."""
  config, params, _ = _tiny(family)
  if config.rope_freq_factors is not None:
    with pytest.raises(ValueError, match="RoPE frequency factors"):
      st.export_hf_checkpoint(params, config, tmp_path)
    config = dataclasses.replace(config, rope_freq_factors=None)
  st.export_hf_checkpoint(params, config, tmp_path)
  exported = json.loads((tmp_path / "config.json").read_text())
  assert exported["model_type"] == family and exported["tie_word_embeddings"] == config.tied_output
  loaded, info = st.load_hf_checkpoint(tmp_path)
  assert families.config_from_info(info) == config
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, params), loaded)


# ------------------------------------------------------------------ the families table


def _mylm(**fields) -> families.Family:
  """A Llama-style family "mylm" added as a user adds one: a preset and one FAMILIES entry
  (llama's Config and weight map; q/k head norms that its files always have)."""
  preset = llama.Config(
    vocab_size=261,
    embed_dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    family="mylm",
    rms_eps=1 / 1024,  # a float32: the GGUF's copy is exact
    tied_output=False,
    qk_norm=True,
  )
  entry = families.Family(
    "mylm",
    llama.Config,
    {"mylm_tiny": preset},
    {"mylm_tiny": 512},
    chat="chatml",
    weights=llama_names,
    gguf_architectures=("mylm",),
    hf_model_types=("mylm",),
    hf_architecture="MyLMForCausalLM",
    fixed={"qk_norm": True},
  )
  return dataclasses.replace(entry, **fields)


@pytest.fixture
def own_table(monkeypatch):
  """FAMILIES and PRESETS as copies, so what a test registers leaves with it."""
  monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))
  monkeypatch.setattr(families, "PRESETS", dict(families.PRESETS))


def test_a_llama_style_variant_is_a_preset_and_one_entry(own_table, tmp_path):
  """A family registered as a preset plus one FAMILIES entry loads through the normal
  loaders: a GGUF of its architecture gives back the weights written and the preset's
  Config; exported, its HF directory names its model_type and architecture, and
  load_model reads it as the preset with the entry's chat format.

  Mutation caught: llama_names.hf_info without the family's `fixed` fields (config.json
  does not state the head norms: their tensors are then unexpected).
  """
  config = families.register(_mylm()).presets["mylm_tiny"]
  assert families.get_config("mylm_tiny") == config and families.context_tokens("mylm_tiny") == 512
  params = jax.tree.map(np.asarray, decoder.init_params(jax.random.key(3), config))
  path = _write_family_gguf(tmp_path / "m.gguf", "mylm", params, config)
  loaded, info = gguf_loader.load_gguf(path)
  assert families.config_from_info(info) == config
  chex.assert_trees_all_equal(params, loaded)
  st.export_hf_checkpoint(params, config, tmp_path / "hf")
  exported = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (exported["model_type"], exported["architectures"]) == ("mylm", ["MyLMForCausalLM"])
  got, got_params, tok = loading.load_model("mylm_tiny", "hf", str(tmp_path / "hf"))
  assert got == config and tok.chat == "chatml"
  chex.assert_trees_all_equal(params, jax.tree.map(np.asarray, got_params))


def test_registration_names_what_would_make_a_second_source(own_table):
  """An entry claiming another family's preset, GGUF architecture or model_type, a preset
  of another family or disagreeing with the entry's `fixed`, a context length missing, or
  a Config without what the decoder reads is refused, naming each problem.

  Mutation caught: `register` without `architecture.check` (a Config lacking
  `activation` registered, to fail later inside a jitted forward).
  """
  families.register(_mylm())
  other = _mylm().presets["mylm_tiny"]
  own = dataclasses.replace(other, family="x")
  cases = {
    r"name 'mylm' is registered.*preset 'mylm_tiny' is another family's": _mylm(),
    r"model_type 'llama' is llama's; GGUF architecture 'qwen2' is qwen2's": _mylm(
      name="x",
      presets={"x1": own},
      context_tokens={"x1": 8},
      gguf_architectures=("qwen2",),
      hf_model_types=("x", "llama"),
    ),
    r"preset 'x1' is a Config of family 'mylm'": _mylm(
      name="x",
      presets={"x1": other},
      context_tokens={"x1": 8},
      gguf_architectures=("x",),
      hf_model_types=("x",),
    ),
    r"context_tokens names \[\], presets \['x1'\]; preset 'x1' has qkv_bias=False, the family fixes True": _mylm(
      name="x",
      presets={"x1": own},
      context_tokens={},
      gguf_architectures=("x",),
      hf_model_types=("x",),
      fixed={"qkv_bias": True},
    ),
  }
  for message, entry in cases.items():
    with pytest.raises(ValueError, match=message):
      families.register(entry)
  bare_type = dataclasses.make_dataclass(
    "Bare", [("family", str), ("vocab_size", int)], frozen=True
  )
  bare = _mylm(
    name="x",
    config=bare_type,
    presets={"x1": bare_type("x", 9)},
    context_tokens={"x1": 8},
    gguf_architectures=("x",),
    hf_model_types=("x",),
    fixed={},
  )
  with pytest.raises(TypeError, match=r"preset 'x1'.*embed_dim is missing.*activation is missing"):
    families.register(bare)
  assert sorted(families.FAMILIES) == ["gemma3", "llama", "mylm", "qwen2", "qwen3"]


def test_each_family_is_found_only_through_its_entry():
  """Every family's GGUF architectures, model types and presets lead back to its entry,
  and no library module but families.py and its presets' module spells a family's name,
  architecture, model type or export class (the loaders keep no table of their own;
  rlpost/text names tokenizer kinds, not families, and is left out).

  Mutation caught: a GGUF_ARCHITECTURES = ("gemma3",) tuple put back in gemma3_names.
  """
  root = pathlib.Path(families.__file__).parents[1]
  for f in families.FAMILIES.values():
    assert all(families.by_gguf_architecture(a, "x") is f for a in f.gguf_architectures)
    assert all(families.by_hf_model_type(t, "x") is f for t in f.hf_model_types)
    assert all(families.of(families.get_config(p)) is f for p in f.presets)
    owners = {pathlib.Path(families.__file__)} | {
      pathlib.Path(__import__(type(c).__module__, fromlist=["_"]).__file__)
      for c in f.presets.values()
    }
    words = {f.name, f.hf_architecture, *f.gguf_architectures, *f.hf_model_types}
    for path in sorted(set(root.rglob("*.py")) - owners):
      if path.parent.name == "text":
        continue
      text = path.read_text()
      found = [w for w in words if f'"{w}"' in text or f"'{w}'" in text]
      assert not found, f"{path.relative_to(root.parent)} names {found}: read FAMILIES instead"


# ------------------------------------------------------------------ byte-level BPE


def test_bpe_merges_by_rank_and_keeps_every_byte():
  """Merges apply lowest rank first, wherever the pair occurs; a pre-token the vocabulary
  lacks as a whole ends as its byte pieces; decoding restores the text (multi-byte
  characters included)."""
  chars = bpe.byte_chars()
  tokens = [chars[b] for b in range(256)] + ["ab", "abc", "bc"]
  tok = bpe.ByteBPE(tokens, ["a b", "ab c", "b c"], bpe.pre_tokenizer("gpt2"))
  ab, abc, bc = 256, 257, 258
  assert tok.encode("abc") == [abc]  # "a b" (rank 0) before "b c" (rank 2)
  assert tok.encode("bcab") == [bc, ab]
  assert tok.encode("aab") == [ord("a"), ab]
  text = "é €"
  assert tok.decode(tok.encode(text)) == text
  assert len(tok.encode("é")) == 2  # two UTF-8 bytes, no merge


def test_bpe_ignore_merges_takes_whole_words_from_the_vocabulary():
  chars = bpe.byte_chars()
  tokens = [chars[b] for b in range(256)] + ["xy", "xyz"]
  plain = bpe.ByteBPE(tokens, ["x y"], bpe.pre_tokenizer("llama-bpe"))
  whole = bpe.ByteBPE(tokens, ["x y"], bpe.pre_tokenizer("llama-bpe"), ignore_merges=True)
  assert plain.encode("xyz") == [256, ord("z")]
  assert whole.encode("xyz") == [257]


@pytest.mark.parametrize("pre", sorted(bpe.PRE_TOKENIZERS))
def test_pre_tokenizers_split_without_losing_text(pre):
  texts = ["Hello  world\n\n 123456 x", "it's 3.14!\t\r\n  end  ", "日本 ½² 🙂", ""]
  for text in texts:
    assert "".join(bpe.split(text, bpe.pre_tokenizer(pre))) == text
  assert bpe.split("a 12345", bpe.pre_tokenizer("llama-bpe"))[-2:] == ["123", "45"]
  assert bpe.split("12", bpe.pre_tokenizer("qwen2")) == ["1", "2"]


# ------------------------------------------------------------------ SmolLM2-135M


def _smollm2_path():
  try:
    return packaged.smollm2_gguf_path()
  except ImportError as e:
    skip_or_fail(str(e))


@pytest.fixture(scope="module")
def smollm2_tokenizer():
  path = _smollm2_path()
  return vocabularies.from_gguf_metadata(gguf_file.read_gguf(path).metadata, str(path))


def _tokenization():
  return json.loads((FIXTURES / "smollm2" / "tokenization.json").read_text())


@pytest.mark.real_model
def test_smollm2_tokenizer_equals_its_tokenizer_json_in_both_modes(smollm2_tokenizer):
  """Our GGUF-built tokenizer encodes 44 strings (ASCII, Unicode, code, digits, whitespace
  runs, chat markup) as transformers does with SmolLM2's tokenizer.json pre-tokenizer
  (digits isolated, then GPT-2's split): control-token text as text and as ids; decoding
  gives the text back. transformers' own GGUF conversion has no `smollm` split and differs
  on exactly the strings where a non-ASCII numeral (½, ², Ⅻ) meets other text.

  Mutations caught: the digit split dropped from `smollm`; merges applied in file order
  instead of by rank.
  """
  tok, fix = smollm2_tokenizer, _tokenization()
  strings = fix["strings"]
  assert len(strings) >= 40
  plain = [tok.encode(s, add_bos=False, parse_special=False) for s in strings]
  special = [tok.encode(s, add_bos=False) for s in strings]
  assert plain == fix["hub_plain"] and special == fix["hub_special"]
  differ = [s for s, a, b in zip(strings, fix["hub_plain"], fix["gguf_plain"]) if a != b]
  assert differ == ["Ⅻ ½ ²"]
  for s, ids in zip(strings, plain):
    assert tok.decode(ids) == s
  assert not tok.uses_bos and tok.chat == "chatml" and tok.eos_id == tok.end_of_turn_id == 2


@pytest.mark.real_model
def test_smollm2_chat_layout_equals_its_templates_rendering(smollm2_tokenizer):
  """Conversations laid out by `chat_formats` decode to the text SmolLM2's own Jinja
  template renders (its default system turn when there is none) and equal the ids of
  that text; control-token text inside a content stays text (the one case that differs
  from tokenizing the rendered text)."""
  tok = smollm2_tokenizer
  assert tok.default_system.startswith("You are a helpful AI assistant named SmolLM")
  for case in _tokenization()["chat"]:
    ids = chat_formats.conversation_ids(tok, case["messages"])
    assert tok.decode(ids, skip_special=False) == case["text"]
    controls = any("<|" in m["content"] for m in case["messages"])
    assert (ids == case["ids"]) != controls, case["messages"]


@pytest.fixture(scope="module")
def smollm2():
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top

  return loading.load_model("smollm2_135m", "gguf", str(_smollm2_path()))


def _smollm2_prompts():
  manifest = json.loads((FIXTURES / "smollm2" / "manifest.json").read_text())
  return [
    (pid, np.load(FIXTURES / "smollm2" / "prompts" / f"{pid}.npz")) for pid in manifest["prompts"]
  ]


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_logprobs_and_greedy_continuations_match_transformers(smollm2):
  """SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized): on 8 prompts, the logprobs of
  transformers' top-20 tokens at every position are within 1e-3 of its float32 ones
  (measured 7.5e-5), and our greedy sampler follows its greedy continuation up to the
  first near-tie (top-2 margin below 0.1). Two programs: one forward over the prompts
  right-padded to one width (a causal mask keeps padding out of every real position),
  one sampler.

  Mutation caught: the llama GGUF's q/k rows left permuted (logprobs off by nats).
  """
  from rlpost import sampling  # pylint: disable=g-import-not-at-top

  config, params, tok = smollm2
  prompts = _smollm2_prompts()
  assert len(prompts) >= 8
  compared = 0
  sc = sampling.SamplingConfig(temperature=0.0, max_new_tokens=32, stop_ids=(), prompt_bucket=32)
  padded, lengths = sampling.pad_prompts([list(z["input_ids"]) for _, z in prompts], sc)
  out = sampling.sample(params, padded, lengths, jax.random.key(0), model_config=config, config=sc)
  width = max(len(z["input_ids"]) for _, z in prompts)
  ids = np.zeros((len(prompts), width), np.int32)
  for k, (_, z) in enumerate(prompts):
    ids[k, : len(z["input_ids"])] = z["input_ids"]
  batch_logits = _forward(params, ids, config)
  for k, (pid, z) in enumerate(prompts):
    logits = batch_logits[k, : len(z["input_ids"])].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    mine = np.take_along_axis(logp, z["hf_top_ids"], 1)
    np.testing.assert_allclose(mine, z["hf_top_logprobs"], atol=1e-3, err_msg=pid)
    near = np.flatnonzero(z["hf_greedy_top2_margin"] < 0.1)
    n = near[0] if len(near) else 32
    np.testing.assert_array_equal(np.asarray(out.tokens[k])[:n], z["hf_greedy_ids"][:n], pid)
    compared += n
  assert compared >= 8 * 16, compared
  assert tok.vocab_size == config.vocab_size


# ------------------------------------------------------------------ recipes


FAMILY_PRESETS = ("llama_tiny", "qwen2_tiny", "qwen3_tiny")
RECIPE_RUNS = ("sft_lora", "sft", "dpo", "grpo", "ppo")  # run_every_recipe's runs


def run_every_recipe(preset: str, tmp, extra=None, recipes=RECIPE_RUNS) -> list[dict]:
  """SFT (LoRA and full), DPO and the RL recipe with each learner, one step each on
  `preset` (with `extra` overrides, e.g. a mesh): GRPO over the one-turn prompt
  environment and PPO (actor and critic) over multi-turn FrozenLake, so both learners,
  both kinds of environment and the cache continuation run. No evaluations (their
  programs are the same on every family). Then the SFT LoRA run is resumed with another
  family's preset, which must be refused (LoRA adapters of llama_tiny and qwen2_tiny
  have the same shapes, so the restore itself would succeed). Returns each run's last
  metrics record. `recipes`: which of RECIPE_RUNS (sft_lora always runs: the refusal
  resumes it). `tests/test_sharding.py` runs it for every family on an FSDP mesh."""
  from conftest import run_metrics, with_overrides  # pylint: disable=g-import-not-at-top
  from experiments.configs import agentic as agentic_configs  # pylint: disable=g-import-not-at-top
  from experiments.configs import dpo as dpo_configs  # pylint: disable=g-import-not-at-top
  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top
  from experiments.configs import sft as sft_configs  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import dpo, rl  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import sft as sft_recipe  # pylint: disable=g-import-not-at-top

  ppo_small = {"algo.critic_warmup_steps": 0, "train.micro_batch_size": 2, "eval.every": 0}
  every = {
    "sft_lora": (
      sft_recipe,
      sft_configs.get_config("tiny"),
      {"lora.enabled": True, "eval.every": 0},
    ),
    "sft": (sft_recipe, sft_configs.get_config("tiny"), {"lora.enabled": False, "eval.every": 0}),
    "dpo": (dpo, dpo_configs.get_config("tiny"), {}),
    "grpo": (rl, grpo_gsm8k.get_config("tiny"), {}),
    "ppo": (rl, agentic_configs.get_config("frozenlake_tiny,ppo"), ppo_small),
  }
  runs = [every["sft_lora"]] + [every[r] for r in recipes if r != "sft_lora"]
  last = []
  for k, (recipe, cfg, run_extra) in enumerate(runs):
    overrides = {"model.preset": preset, "train.steps": 1, **(extra or {}), **run_extra}
    recipe.run(with_overrides(cfg, overrides), f"{tmp}/run{k}")
    last.append(run_metrics(f"{tmp}/run{k}")[-1])
  # The SFT LoRA run resumed with another family's preset (adapters of the same shapes).
  other = "qwen2_tiny" if preset != "qwen2_tiny" else "llama_tiny"
  recipe, cfg, run_extra = runs[0]
  overrides = {"model.preset": other, "train.steps": 2, **(extra or {}), **run_extra}
  with pytest.raises(errors.ConfigError, match=rf"{other}.*run in .*trains '{preset}'"):
    recipe.run(with_overrides(cfg, overrides), f"{tmp}/run0")
  return last


# ------------------------------------------------------------------ bad input


def test_unsupported_hf_architecture_and_foreign_tokenizer_are_named(tmp_path):
  """A config.json of an unsupported model_type names it and the supported ones; a
  tokenizer with more ids than the weights' embedding rows (another model's) is refused."""
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top
  from rlpost.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  config = json.loads((FIXTURES / "tiny" / "qwen2" / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
  with pytest.raises(errors.DataError, match=r"model_type='mistral' is not supported.*'qwen3'"):
    st.load_hf_checkpoint(tmp_path)
  small = families.get_config("llama_tiny", vocab_size=200)
  with pytest.raises(errors.DataError, match="261 tokens but the model's embedding only 200"):
    loading.check_vocabulary(small, tokenizer_lib.byte_tokenizer("llama3"), "x.gguf")
  config, params, tok = loading.load_model("qwen2_tiny", "hf", str(FIXTURES / "tiny" / "qwen2"))
  assert config.family == "qwen2" and tok.chat == "chatml"
  with pytest.raises(ValueError, match="weights are a qwen2 model and model.preset='qwen3_tiny'"):
    loading.load_model("qwen3_tiny", "hf", str(FIXTURES / "tiny" / "qwen2"))


@pytest.mark.real_model
def test_hf_tokenizer_json_reads_like_the_gguf_vocabulary(smollm2_tokenizer, tmp_path):
  """A tokenizer.json in Hugging Face's schema (BPE vocab and merges, added tokens, the
  Digits + ByteLevel pre-tokenizer SmolLM2 ships) and its tokenizer_config.json (special
  tokens, chat template) give the GGUF tokenizer's encodings, specials and chat layout.
  A Split step carries its regex over (Llama 3's pattern splits as `llama-bpe`)."""
  tok = smollm2_tokenizer
  metadata = gguf_file.read_gguf(_smollm2_path()).metadata
  tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
  added = [i for i, t in enumerate(types) if t == 3]
  spec = {
    "added_tokens": [{"id": i, "content": tokens[i], "special": True} for i in added],
    "pre_tokenizer": {
      "type": "Sequence",
      "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
      ],
    },
    "model": {
      "type": "BPE",
      "vocab": {t: i for i, t in enumerate(tokens) if i not in added},
      "merges": [m.split(" ") for m in metadata["tokenizer.ggml.merges"]],
    },
  }
  config = {
    "bos_token": "<|im_start|>",
    "eos_token": {"content": "<|im_end|>"},
    "pad_token": "<|im_end|>",
    "chat_template": metadata["tokenizer.chat_template"],
  }
  (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  hf = vocabularies.from_hf_directory(tmp_path)
  fix = _tokenization()
  assert [hf.encode(s, add_bos=False, parse_special=False) for s in fix["strings"]] == fix[
    "hub_plain"
  ]
  assert [hf.encode(s, add_bos=False) for s in fix["strings"]] == fix["hub_special"]
  got = (hf.chat, hf.default_system, hf.end_of_turn_id, hf.start_of_turn_id, hf.uses_bos)
  assert got == (tok.chat, tok.default_system, tok.end_of_turn_id, tok.start_of_turn_id, False)
  # Llama 3's tokenizer.json: its Split regex, then ByteLevel without a regex of its own.
  regex = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
  )
  llama3 = {
    "type": "Sequence",
    "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated"},
      {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    ],
  }
  patterns = vocabularies._hf_patterns(llama3, "tokenizer.json")  # pylint: disable=protected-access
  assert patterns == (regex,)
  assert bpe.split("I'M 12345 here\n\n", patterns) == ["I", "'M", " ", "123", "45", " here", "\n\n"]


# ------------------------------------------------------------------ chat formats


@pytest.mark.parametrize(
  "chat, want",
  [
    ("gemma", "<bos><start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\n"),
    (
      "chatml",
      "<bos><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
      "<|im_start|>assistant\n",
    ),
    (
      "llama3",
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
  ],
)
def test_each_chat_format_lays_out_rl_and_sft_prompts_alike(chat, want):
  """The RL scaffold's first prompt (a system text and an observation) is the format's
  layout (a system turn where the format has one; Gemma opens the user turn with it), and
  an SFT record's prompt span is the same ids; the model's turn close and what follows
  it come next in SFT, and after a turn the scaffold continues from there.

  Mutation caught: the system text dropped from the chat scaffold's first prompt."""
  from rlpost.data import chat as chat_data  # pylint: disable=g-import-not-at-top
  from rlpost.text import scaffold  # pylint: disable=g-import-not-at-top
  from rlpost.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  tok = tokenizer_lib.byte_tokenizer(chat)
  prompt = scaffold.prompt_ids(tok, "chat", "Q", "S")
  assert tok.decode(prompt, skip_special=False) == want
  tokens, mask = chat_data.tokenize_sft({"system": "S", "prompt": "Q", "completion": "A"}, tok, 256)
  assert list(tokens[: len(prompt)]) == prompt and not mask[: len(prompt)].any()
  after = scaffold.observation_ids(tok, "chat", "R", model_closed_turn=True)
  closing = chat_formats.closing(tok)
  assert list(tokens[len(prompt) :]) == tok.encode("A", add_bos=False) + closing
  assert after[: len(closing) - 1] == closing[1:]


@pytest.mark.parametrize("chat", ["gemma", "chatml", "llama3"])
def test_single_turn_rewards_see_the_prompt_in_the_tokenizers_chat_format(chat):
  """A prompt task's reward functions get the prompt the model is shown, as text: the
  scaffold's first prompt (system text given, empty, or the tokenizer's default) decoded,
  BOS aside, in every chat format, not Gemma's markup for every family.

  Mutation caught: `single_turn.make_env` ignoring its `chat` argument (Gemma text)."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from rlpost.data import gsm8k  # pylint: disable=g-import-not-at-top
  from rlpost.data import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  from rlpost.envs import single_turn  # pylint: disable=g-import-not-at-top
  from rlpost.text import scaffold  # pylint: disable=g-import-not-at-top
  from rlpost.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  preamble = "P\n" if chat == "llama3" else ""
  tok = dataclasses.replace(
    tokenizer_lib.byte_tokenizer(chat), default_system="D", system_preamble=preamble
  )
  seen = []
  reward = lambda prompts, completions, answers: seen.extend(prompts) or [1.0] * len(prompts)
  problem = gsm8k.Problem(question="Q <|im_end|>", answer="4", final="4")
  for system in ("S", ""):
    task = tasks_lib.Task([problem], {"r": reward}, {}, [], system=system)
    env, kind = single_turn.make_env(task, "chat", tok)
    state, observation = env.reset(problem, 0)
    env.step(state, "A")
    ids = scaffold.prompt_ids(tok, kind, observation, env.system)
    assert tok.decode(ids[1:], skip_special=False) == seen[-1]
  assert ("D" in seen[-1]) and ("S" in seen[0]) and (preamble in seen[0])


# Llama 3.1's and 3.2's templates (the lines that matter): the system turn, always written,
# opens with the knowledge and date lines; the date falls back to a literal.
_LLAMA32_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}"""


def test_llama3_date_preamble_opens_every_system_turn():
  """A Llama 3.1+ template's knowledge and date lines (its literal date) open the system
  turn, which is written even with no system text, as transformers renders it
  ("...system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date:
  26 Jul 2024\\n\\n{system}<|eot_id|>"); Llama 3.0's template (no such lines) has none.

  Mutation caught: the preamble written only when there is a system text."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from rlpost.text import scaffold  # pylint: disable=g-import-not-at-top
  from rlpost.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  preamble = chat_formats.system_preamble(_LLAMA32_TEMPLATE, "llama3")
  assert preamble == "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
  assert chat_formats.system_preamble(_LLAMA32_TEMPLATE, "chatml") == ""
  llama30 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
  assert chat_formats.system_preamble(llama30, "llama3") == ""
  tok = dataclasses.replace(tokenizer_lib.byte_tokenizer("llama3"), system_preamble=preamble)
  head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + preamble
  tail = "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
  tail += "<|start_header_id|>assistant<|end_header_id|>\n\n"
  for system, text in ((None, ""), ("S", "S")):
    ids = scaffold.prompt_ids(tok, "chat", "Q", system)
    assert tok.decode(ids, skip_special=False) == head + text + "<|eot_id|>" + tail


def test_broken_tokenizer_files_are_named(tmp_path):
  """A tokenizer.json that is not JSON, not a BPE model, or carries a bad merge, and a
  tokenizer_config.json that is not an object, fail naming the file (DataError), not with
  a bare JSONDecodeError / KeyError."""
  spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}
  cases = [
    ("{not json", {}, r"tokenizer\.json: not valid JSON"),
    (json.dumps({"model": {"type": "Unigram"}}), {}, r"model type 'Unigram'; only BPE"),
    (json.dumps({**spec, "model": {**spec["model"], "merges": ["ab"]}}), {}, r"merge 0 is 'ab'"),
    (json.dumps(spec), "[1]", r"tokenizer_config\.json: expected a JSON object"),
    (json.dumps(spec), {"eos_token": "a"}, r"neither the chat template nor the vocabulary"),
  ]
  for text, config, match in cases:
    (tmp_path / "tokenizer.json").write_text(text)
    (tmp_path / "tokenizer_config.json").write_text(
      config if isinstance(config, str) else json.dumps(config)
    )
    with pytest.raises(errors.DataError, match=match):
      vocabularies.from_hf_directory(tmp_path)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_llama3_and_qwen2_pre_tokenizers_split_as_hugging_face_tokenizers(pre):
  """Our `llama-bpe` and `qwen2` splits equal `tokenizers`' Split with transformers' own
  regexes for those GGUF pre-tokenizer names, on the 44 fixture strings."""
  fix = json.loads((FIXTURES / "pre_tokenizers.json").read_text())
  assert [bpe.split(s, bpe.pre_tokenizer(pre)) for s in fix["strings"]] == fix[pre]


def test_default_system_text_is_the_templates_literal_system_turn():
  """SmolLM2's template (newlines as written in its GGUF) and a Qwen2.5-style template
  (Jinja's "\\n" escape, the default in an else branch) give their literal system turn;
  a template that builds the system turn from the messages (Qwen3) gives none."""
  smol = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}{% endfor %}"
  )
  qwen25 = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
  )
  qwen3 = "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
  assert chat_formats.default_system(smol, "chatml") == "You are SmolLM"
  assert chat_formats.default_system(qwen25, "chatml").startswith("You are Qwen, created by")
  assert chat_formats.default_system(qwen3, "chatml") is None
  assert chat_formats.default_system(smol, "gemma") is None
