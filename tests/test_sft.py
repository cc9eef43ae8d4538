"""SFT: loss-token gather against full logits, loss-mask invariance, packing, overfit, resume."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import sft as sft_configs
from rlpost.supervised import sft
from rlpost.recipes import sft as sft_recipe
from rlpost.train import step as train
from rlpost.text import tokenizer as tokenizer_lib
from rlpost import errors
from rlpost.data import chat
from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import policy
from rlpost.data.cursor import Cursor
from rlpost.data import gsm8k
from rlpost.envs import tool_traces
from rlpost.models import lora as lora_lib
from rlpost.recipes import common
import real_models
from conftest import GSM8K_DIR, assert_adapters_trained, require_gemma3, require_shared

CONFIG = families.get_config("tiny")
TOK = tokenizer_lib.byte_tokenizer()
SEQ = 48


def _params(seed=0):
  return decoder.init_params(jax.random.key(seed), CONFIG)


def _examples(n, seed=0):
  return [chat.tokenize_sft(r, TOK, SEQ) for r in sft.synthetic_records(n, seed)]


def _dense_reference_nll(params, batch):
  """Token-mean NLL from full [B, T, V] logits and log_softmax (independent of the gather)."""
  mask = jnp.asarray(batch["segment_ids"])
  attn = mask[:, :, None] == mask[:, None, :]
  attn = attn & jnp.tril(jnp.ones(mask.shape[1:] * 2, bool))[None] & (mask != 0)[:, None, :]
  logits, _ = decoder.forward(params, batch["tokens"], batch["positions"], attn, config=CONFIG)
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, jnp.asarray(batch["targets"])[..., None], axis=-1)[..., 0]
  m = jnp.asarray(batch["target_mask"])
  return -jnp.sum(jnp.where(m, picked, 0.0)) / jnp.sum(m)


_LOSS_FN = sft.make_loss_fn(policy.ForwardConfig(CONFIG, remat="dots"))  # the configs' default


@jax.jit
def _loss_and_grad(params, batch):
  return jax.value_and_grad(lambda p: _LOSS_FN(p, None, batch)[0])(params)


def test_batch_targets_and_gather_layout():
  batch = sft.make_batch(
    _examples(4), seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=2, gather_bucket=8
  )
  np.testing.assert_array_equal(batch["targets"][:, :-1], batch["tokens"][:, 1:])
  np.testing.assert_array_equal(batch["target_mask"][:, :-1], batch["loss_mask"][:, 1:])
  for j in range(2):
    rows = slice(2 * j, 2 * j + 2)
    flat = batch["gather_index"][rows].reshape(-1)[batch["gather_valid"][rows].reshape(-1)]
    np.testing.assert_array_equal(flat, np.flatnonzero(batch["target_mask"][rows]))
  assert batch["gather_index"].shape[1] * 2 % 8 == 0
  assert batch["token_divisor"][0] == batch["target_mask"].sum() / 2


@pytest.mark.slow
def test_gathered_loss_matches_full_logits():
  params = _params()
  batch = sft.make_batch(_examples(4), seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=4)
  loss, _ = _loss_and_grad(params, batch)
  np.testing.assert_allclose(loss, jax.jit(_dense_reference_nll)(params, batch), rtol=1e-5)


@pytest.mark.slow
def test_remat_policies_agree():
  params = _params(4)
  batch = sft.make_batch(_examples(4), seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=4)
  loss, grads = _loss_and_grad(params, batch)
  for remat in ("none", "full"):
    loss_fn = sft.make_loss_fn(policy.ForwardConfig(CONFIG, remat=remat))
    loss2, grads2 = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, None, batch)[0]))(params)
    np.testing.assert_allclose(loss, loss2, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, grads2)
  with pytest.raises(ValueError, match="remat"):
    policy.ForwardConfig(CONFIG, remat="some")


def test_loss_mask_invariance():
  """Targets outside the loss mask and padding tokens change neither loss nor gradient."""
  params = _params(1)
  batch = sft.make_batch(_examples(4, seed=3), seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=4)
  assert (batch["segment_ids"] == 0).any() and (~batch["target_mask"]).any()
  loss, grads = _loss_and_grad(params, batch)
  rng = np.random.default_rng(0)
  changed = {k: v.copy() for k, v in batch.items()}
  noise = rng.integers(5, 261, size=batch["targets"].shape)
  changed["targets"] = np.where(batch["target_mask"], batch["targets"], noise)
  changed["tokens"] = np.where(batch["segment_ids"] == 0, noise, batch["tokens"])
  loss2, grads2 = _loss_and_grad(params, changed)
  assert float(loss) == float(loss2)
  jax.tree.map(np.testing.assert_array_equal, grads, grads2)
  # Control: a target inside the mask does change the loss.
  b, t = np.argwhere(batch["target_mask"])[0]
  changed["targets"][b, t] = (batch["targets"][b, t] + 1 - 5) % 256 + 5
  assert float(_loss_and_grad(params, changed)[0]) != float(loss)


@pytest.mark.slow
def test_packed_equals_unpacked():
  params = _params(2)
  examples = _examples(6, seed=4)
  padded = sft.make_batch(examples, seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=6)
  packed = sft.make_batch(
    examples, seq_len=2 * SEQ, pad_id=TOK.pad_id, micro_batch_size=1, pack=True
  )
  assert packed["tokens"].shape[0] < 6
  assert (
    sft.batch_stats(packed)["padding_efficiency"] > sft.batch_stats(padded)["padding_efficiency"]
  )
  loss_a, grads_a = _loss_and_grad(params, padded)
  rows = packed["tokens"].shape[0]
  packed = sft.make_batch(
    examples, seq_len=2 * SEQ, pad_id=TOK.pad_id, micro_batch_size=rows, pack=True
  )
  loss_b, grads_b = _loss_and_grad(params, packed)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_a, grads_b
  )


@pytest.mark.slow
def test_token_mean_is_exact_across_micro_batches():
  """The train step's loss and gradient are the batch token mean whatever the split.

  SGD with learning rate 1 makes the update the gradient itself, checked against
  autodiff of the dense reference NLL. Mutation caught: gradients summed over
  micro-batches (AdamW would hide the scale).
  """
  params = _params(3)
  examples = _examples(4, seed=5)
  opt = optax.sgd(1.0)
  mesh = train.make_mesh(1)
  whole = sft.make_batch(examples, seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=4)
  want_loss, want_grads = jax.jit(jax.value_and_grad(_dense_reference_nll))(params, whole)
  for micro in (1, 2, 4):
    batch = sft.make_batch(examples, seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=micro)
    step = train.make_train_step(sft.make_loss_fn(policy.ForwardConfig(CONFIG)), opt, mesh, micro)
    state = train.init_train_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(0))
    state, metrics = step(state, None, batch)
    np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5)
    grads = jax.tree.map(lambda before, after: before - after, params, state.trainable)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6), grads, want_grads
    )
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(want_grads), rtol=1e-4)


def test_next_examples_packed_consumes_what_fits():
  lengths = [30, 20, 25, 10, 40, 5]
  taken, cursor = sft.next_examples(
    Cursor(0), lengths, rows=2, seq_len=48, pack=True, shuffle=False
  )
  assert taken == [0, 1, 2, 3]  # 30+10 | 20+25; 40 does not fit
  assert cursor.position == 4
  taken, _ = sft.next_examples(cursor, lengths, rows=2, seq_len=48, pack=True, shuffle=False)
  assert taken[:2] == [4, 5]


def _tiny_config(**overrides):
  cfg = sft_configs.get_config("tiny")
  cfg.eval.every = 0
  for key, value in overrides.items():
    section, name = key.split("__")
    cfg[section][name] = value
  return cfg


@pytest.mark.slow
@pytest.mark.contracting_codegen
def test_overfits_16_examples(tmp_path):
  """150 full-weight steps on 16 examples drive the loss under 0.05, at LLVM -O1
  (`contracting_codegen`; measured 0.023 there, 0.014 at XLA's default, 0.068 once with an
  -O0 random init)."""
  cfg = _tiny_config(
    data__num_synthetic=16,
    train__batch_size=16,
    train__micro_batch_size=16,
    train__steps=150,
    train__learning_rate=1e-2,
    checkpoint__every=1000,
  )
  _, record = sft_recipe.run(cfg, str(tmp_path))
  assert record["loss"] < 0.05, record


# Runs shared by module: the LoRA run is also test_init_from's LoRA source, the resume
# test's uninterrupted run its full-weights source.
LORA_RUN = {"lora__enabled": True, "train__steps": 3, "data__pack": True, "checkpoint__every": 100}
FULL_RUN = {"train__steps": 4, "checkpoint__every": 2, "data__pack": True}


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  """`sft_run(**overrides)`: (state, last record, workdir) of the tiny run with `overrides`,
  run once per module (nothing mutates the returned state)."""
  done = {}

  def run(**overrides):
    key = tuple(sorted(overrides.items()))
    if key not in done:
      workdir = tmp_path_factory.mktemp("sft")
      done[key] = (*sft_recipe.run(_tiny_config(**overrides), str(workdir)), workdir)
    return done[key]

  return run


@pytest.mark.slow
def test_lora_trains_adapters_only(sft_run):
  state, record, _ = sft_run(**LORA_RUN)
  assert_adapters_trained(jax.device_get(state.trainable))
  assert np.isfinite(record["loss"]) and 0 < record["padding_efficiency"] <= 1


@pytest.mark.slow
def test_resume_is_bitwise(sft_run, tmp_path):
  straight, _, workdir_a = sft_run(**FULL_RUN)
  cfg = _tiny_config(**FULL_RUN)
  sft_recipe.run(cfg, str(tmp_path / "b"), stop_after=2)
  resumed, _ = sft_recipe.run(cfg, str(tmp_path / "b"))
  assert int(resumed.step) == 4
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get(straight.trainable),
    jax.device_get(resumed.trainable),
  )
  lines_a = (workdir_a / "metrics.jsonl").read_text().splitlines()
  lines_b = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
  assert len(lines_a) == len(lines_b) == 4
  assert (tmp_path / "b" / "curves.png").exists()


@pytest.mark.slow
def test_gsm8k_tool_traces_train_on_the_model_segments_only(tmp_path):
  """data.source=gsm8k_tools: each example is the gsm8k_calc rollout stream of a converted
  solution (zero-shot prompt); the loss covers the model's calls and text, never results.
  Over 20 s: rows of 1536 tokens (whole tool-call streams) through a train step."""
  data_dir = require_shared(GSM8K_DIR)
  cfg = _tiny_config(
    data__source="gsm8k_tools",
    data__data_dir=str(data_dir),
    data__seq_len=1536,
    data__num_examples=4,
    train__steps=2,
    train__batch_size=2,
    train__micro_batch_size=2,
    checkpoint__every=1000,
  )
  cfg.eval.every, cfg.eval.num_examples = 2, 2
  train, held_out = sft_recipe.tokenized_examples(cfg, TOK)
  assert len(train) == 4 and len(held_out) == 2
  problems = gsm8k.load_gsm8k("train", str(data_dir))
  kept, _ = tool_traces.tool_traces(problems, limit=len(train))
  for (ids, mask), (problem, trace) in zip(train, kept):
    start = int(np.argmax(mask))
    prompt = TOK.decode(ids[:start])
    assert prompt.endswith(f"Question: {problem.question}\nAnswer: <reasoning>\n")
    trained = TOK.decode(ids[mask])
    assert "<result>" not in trained and trained.startswith(trace[0].text)
    calls = sum(role == "tool" for role, _ in trace)
    assert trained.count("<tool>calculator:") == calls
    assert TOK.decode(ids[start:][~mask[start:]]).count("<result>") == calls
  _, record = sft_recipe.run(cfg, str(tmp_path))
  assert np.isfinite(record["loss"]) and np.isfinite(record["eval_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_init_from_starts_from_the_earlier_runs_weights(sft_run, tmp_path, lora):
  """model.init_from = an SFT workdir: its newest weights (LoRA adapters merged into the
  same base); a run of another model block is refused. The earlier runs are the LoRA and
  the resume tests' (a 3- and a 4-step run; were 2-step runs of their own)."""
  overrides = LORA_RUN if lora else FULL_RUN
  state, _, workdir = sft_run(**overrides)
  cfg = _tiny_config(**overrides)
  base = common.load_model(cfg)[1]
  trained = jax.device_get(state.trainable)
  expected = lora_lib.merge(base, trained, common.lora_config(cfg)) if lora else trained
  follow = _tiny_config(lora__enabled=not lora)  # the new run's own LoRA setting is free
  follow.model.init_from = str(workdir)
  _, params, _ = common.load_model(follow)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), jax.device_get(expected))
  assert not np.array_equal(params["layers"]["q"], base["layers"]["q"])
  follow.model.dtype = "bfloat16"
  with pytest.raises(ValueError, match="model.init_from.*model.dtype"):
    common.load_model(follow)
  follow.model.dtype, follow.model.init_from = "float32", str(tmp_path / "nothing")
  with pytest.raises(ValueError, match="model.init_from.*config.json"):
    common.load_model(follow)
  follow.model.init_from, follow.seed = str(workdir), follow.seed + 1
  if lora:  # adapters fit the random base of their seed only; full weights replace it
    with pytest.raises(ValueError, match=r"model.init_from.*seed 0, this run's .* seed 1"):
      common.load_model(follow)
  else:
    common.load_model(follow)


@pytest.mark.slow
def test_init_from_a_lora_run_that_started_from_another_merges_both(sft_run, tmp_path):
  """A LoRA run B that itself started from LoRA run A trained its adapters over A's merged
  weights: a run from B gets base + A's adapters + B's, in that order. Mutation caught:
  `weights_from_run` merging B's adapters into the raw base (A's training lost)."""
  state_a, _, dir_a = sft_run(**LORA_RUN)
  cfg_b = _tiny_config(**{**LORA_RUN, "train__steps": 1})
  cfg_b.model.init_from = str(dir_a)
  state_b, _ = sft_recipe.run(cfg_b, str(tmp_path / "b"))
  follow = _tiny_config()
  follow.model.init_from = str(tmp_path / "b")
  _, params, _ = common.load_model(follow)
  lora_cfg = common.lora_config(cfg_b)
  base = common.load_model(_tiny_config())[1]
  after_a = lora_lib.merge(base, jax.device_get(state_a.trainable), lora_cfg)
  expected = lora_lib.merge(after_a, jax.device_get(state_b.trainable), lora_cfg)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), jax.device_get(expected))


@pytest.mark.slow
def test_jsonl_messages_with_held_out_eval(tmp_path):
  """A JSONL of multi-turn messages trains; the last records are held out for eval."""
  path = tmp_path / "chats.jsonl"
  with open(path, "w", encoding="utf-8") as f:
    for r in sft.synthetic_records(12, seed=7):
      turns = [
        {"role": "user", "content": r["prompt"]},
        {"role": "assistant", "content": r["completion"]},
      ] * 2
      f.write(json.dumps({"messages": turns}) + "\n")
  cfg = _tiny_config(
    train__steps=2,
    checkpoint__every=100,
    data__source="jsonl",
    data__path=str(path),
    data__seq_len=64,
  )
  cfg.eval.every, cfg.eval.num_examples = 2, 5
  _, record = sft_recipe.run(cfg, str(tmp_path / "run"))
  assert np.isclose(record["eval_perplexity"], np.exp(record["eval_loss"]))
  assert record["examples"] == cfg.train.batch_size
  first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
  assert first["step"] == 0 and "eval_loss" in first  # baseline before training
  # The baseline is the token-mean NLL of the initial params over the LAST 5 records, from
  # full logits: evaluation goes 4 rows at a time (batches of 4 and 1 + 3 fillers), so a
  # mean of batch means, a filler that counts, or the wrong records all fail here.
  held_out = [chat.tokenize_sft(r, TOK, 64) for r in chat.load_sft_jsonl(str(path))[-5:]]
  batch = sft.make_batch(held_out, seq_len=64, pad_id=TOK.pad_id, micro_batch_size=5)
  want = jax.jit(_dense_reference_nll)(_params(cfg.seed), batch)
  np.testing.assert_allclose(first["eval_loss"], want, rtol=1e-5)


@pytest.mark.parametrize(
  "section,name,value,field",
  [
    ("train", "batch_size", 6, "train.batch_size"),
    ("data", "source", "jsonl", "data.path"),
    ("data", "source", "parquet", "data.source"),
    ("data", "path", "/nonexistent.jsonl", "data.source"),
    ("lora", "targets", "q,attn", "lora.targets"),
    ("data", "seq_len", 1, "data.seq_len"),
    ("train", "remat", "all", "train.remat"),
    ("train", "compute_dtype", "float16", "train.compute_dtype"),
    ("mesh", "rollout", 1, "mesh.rollout"),
    # Mutation caught: MeshConfig's one message for all three fields, as before
    # ("MeshConfig(data=0, fsdp=0, rollout=0): use ..."), names no config field.
    ("mesh", "fsdp", 0, "config.mesh.fsdp=0: use >= 1"),
    ("mesh", "data", -1, "config.mesh.data=-1: use >= 0"),
    ("eval", "num_examples", -1, "eval.num_examples"),
    ("data", "num_examples", -1, "data.num_examples"),
    ("data", "num_synthetic", 0, "data.num_synthetic"),
    ("train", "max_grad_norm", -1.0, "train.max_grad_norm"),
  ],
)
def test_config_validation_names_field(section, name, value, field):
  cfg = _tiny_config(lora__enabled=True)
  cfg[section][name] = value
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    sft_recipe.check_config(cfg)


def test_an_empty_jsonl_file_fails_naming_its_field(tmp_path):
  """Mutation caught: without the emptiness checks in sft_recipe.records, an empty
  data.path failed as "would hold out 16 of the 0 records ... leaving -16 to train on",
  and an empty data.eval_path silently meant no evaluation at all."""
  empty, good = tmp_path / "empty.jsonl", tmp_path / "good.jsonl"
  empty.write_text("")
  good.write_text("".join(f'{{"prompt": "{i}+1=", "completion": "{i + 1}"}}\n' for i in range(4)))
  cfg = _tiny_config(data__source="jsonl", data__path=str(empty))
  cfg.eval.every = 5
  with pytest.raises(ValueError, match=r"config\.data\.path='.*empty\.jsonl': holds no records"):
    sft_recipe.records(cfg)
  cfg.data.path, cfg.data.eval_path = str(good), str(empty)
  with pytest.raises(ValueError, match=r"config\.data\.eval_path='.*': holds no records to eval"):
    sft_recipe.records(cfg)
  cfg.eval.every = 0  # no evaluation asked for: the empty held-out file is not read for it
  assert len(sft_recipe.records(cfg)[0]) == 4


def test_a_held_out_split_may_take_at_most_half_the_records():
  """The last eval.num_examples records are held out: beyond half of the set, the run
  fails naming the field (it used to shrink the training set to a single record)."""
  cfg = _tiny_config(data__num_synthetic=10)
  cfg.eval.every, cfg.eval.num_examples = 1, 5
  train, held_out = sft_recipe.records(cfg)
  assert (len(train), len(held_out)) == (5, 5) and train + held_out == sft.synthetic_records(
    10, cfg.seed
  )
  cfg.eval.num_examples = 6
  with pytest.raises(ValueError, match=r"config\.eval\.num_examples=6: .*of the 10 records"):
    sft_recipe.records(cfg)
  cfg.eval.every = 0  # no evaluation: every record trains
  assert [len(split) for split in sft_recipe.records(cfg)] == [10, 0]


def test_an_empty_jsonl_fails_naming_the_path(tmp_path):
  path = tmp_path / "empty.jsonl"
  path.write_text("")
  cfg = _tiny_config(data__source="jsonl", data__path=str(path))
  with pytest.raises(ValueError, match=r"config\.data\.path='.*empty\.jsonl': holds no records"):
    sft_recipe.records(cfg)


def test_a_prompt_longer_than_seq_len_is_left_out_or_refused_naming_its_line(tmp_path, capsys):
  """A JSONL record whose prompt alone fills data.seq_len could never train: left out and
  counted, naming its line (data.on_too_long='skip', the default), or a DataError naming
  its line ('error'); with every record such, an error naming config.data.seq_len.

  Mutation caught: recipes.sft.tokenized_examples calling chat.tokenize_sft unwrapped.
  """
  path = tmp_path / "chats.jsonl"
  good, long = ({"prompt": p, "completion": "y"} for p in ("x", "x" * 40))
  path.write_text("".join(json.dumps(r) + "\n" for r in (good, long)))
  cfg = _tiny_config(data__source="jsonl", data__path=str(path), data__seq_len=24)
  cfg.eval.every = 0
  train, _ = sft_recipe.tokenized_examples(cfg, tokenizer_lib.byte_tokenizer())
  assert len(train) == 1
  assert (
    f"left out 1 of 2 records whose prompt leaves no room for a response in data.seq_len=24 tokens (first: {path}:2)"
    in capsys.readouterr().out
  )
  cfg.data.on_too_long = "error"
  with pytest.raises(errors.DataError, match=rf"^{path}:2: SFT record's prompt is"):
    sft_recipe.tokenized_examples(cfg, tokenizer_lib.byte_tokenizer())
  path.write_text(json.dumps(long) + "\n")
  cfg.data.on_too_long = "skip"
  with pytest.raises(
    ValueError, match=r"^config\.data\.seq_len=24: no record's prompt leaves room"
  ):
    sft_recipe.tokenized_examples(cfg, tokenizer_lib.byte_tokenizer())


def test_unknown_variant():
  with pytest.raises(ValueError, match="variant"):
    sft_configs.get_config("gemma9")


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_one_lora_sft_step_on_gsm8k(tmp_path):
  """One LoRA SFT step of Gemma 3 270M on two GSM8K problems through the experiment path
  (the model is loaded once per worker, tests/real_models.py). Over 20 s beside the other
  worker: the step itself, forward and backward of 18 layers and the 262k-token vocabulary
  over 2 x 384 tokens, runs ~9 s (22.6 CPU s alone compiled fast, 19.4 with XLA's
  defaults: the step is mostly matmuls, which -O0 does not slow)."""
  require_gemma3()
  data_dir = require_shared(GSM8K_DIR)
  cfg = sft_configs.get_config("gemma3_270m")
  cfg.data.data_dir = str(data_dir)
  cfg.data.num_examples = 2
  cfg.train.steps, cfg.train.batch_size, cfg.train.micro_batch_size = 1, 2, 2
  cfg.eval.every = 0
  state, record = sft_recipe.run(cfg, str(tmp_path), loaded=real_models.loaded_for(cfg))
  assert cfg.lora.enabled and set(state.trainable) == {"layers"}
  # The pretrained model already predicts worked solutions far better than chance
  # (uniform over 262,144 tokens would be 12.5 nats).
  assert 0.1 < record["loss"] < 4.0, record
  assert record["target_tokens"] > 50 and np.isfinite(record["grad_norm"])
  assert (tmp_path / "checkpoints" / "1").exists()
