"""Torch / transformers oracle for the Llama-architecture families (issue 37's fixtures).

Runs in an environment of its own with torch and transformers (neither is a dependency
of rlpost; nothing in rlpost imports this file). Writes OUT_DIR (committed as
tests/fixtures/families/):

  smollm2/manifest.json         versions, prompts, settings
  smollm2/prompts/<id>.npz      input_ids [T], hf_top_ids / hf_top_logprobs [T, 20] (the
                                20 highest-logit tokens at each position, log-softmax over
                                the whole vocabulary in float64), hf_greedy_ids [N],
                                hf_greedy_top2_margin [N] (top-1 minus top-2 logit)
  smollm2/tokenization.json     strings -> ids: `plain` (control-token text stays text)
                                and `special` (control-token text is its id), each with
                                transformers' GGUF tokenizer as it builds it (`gguf_*`) and
                                with SmolLM2's own tokenizer.json pre-tokenizer (digits
                                isolated, then GPT-2's ByteLevel split: `hub_*`); chat
                                renders of the file's template (`chat`)
  pre_tokenizers.json           the 44 strings split by `tokenizers`' Split with
                                transformers' regexes for the GGUF pre-tokenizer names
                                llama-bpe (Llama 3) and qwen2
  tiny/<family>/                config.json + model.safetensors of a tiny random model
                                (transformers' own save_pretrained) and logits.npz:
                                input_ids [B, T], logits [B, T, V] float32

SmolLM2: `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` dequantizes the Q4_1 /
Q8_0 file to float32 (eager attention, float32 math, positions 0..T-1, no padding).
Greedy continuations run with the KV cache.

usage: python hf_families.py OUT_DIR SMOLLM2_GGUF
"""

import json
import os
import pathlib
import sys

import numpy as np
import torch
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
TOP_K = 20
GREEDY = 32
SYSTEM = "You are a careful assistant. Answer briefly."
PROMPTS = {  # id -> (kind, text or messages)
  "short_fact": ("text", "The capital of France is"),
  "chat_simple": ("chat", [{"role": "user", "content": "What is 2+2?"}]),
  "chat_system": (
    "chat",
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name three colors."}],
  ),
  "gsm8k_chat": (
    "chat",
    [
      {
        "role": "user",
        "content": "Natalia sold clips to 48 of her friends in April, and then she sold "
        "half as many clips in May. How many clips did Natalia sell altogether in April "
        "and May?",
      }
    ],
  ),
  "code": ("text", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
  "multilingual": (
    "text",
    "English: Good morning.\nFrench: Bonjour.\nEnglish: Thank you.\nFrench:",
  ),
  "numbers_ws": ("text", "Prices:\n  apples   $1.25\n  pears    $0.50\nTotal for 3 apples:"),
  "frozenlake": (
    "chat",
    [
      {
        "role": "user",
        "content": "You are on a 4x4 frozen lake.\nS F F F\nF H F H\nF F F H\nH F F G\n"
        "Reply with one move: up, down, left or right.",
      }
    ],
  ),
}
STRINGS = [
  "Hello world",
  "  leading spaces",
  "trailing   ",
  "tabs\tand\nnewlines\n\n\n",
  "12345 + 678 = 99999",
  "3.14159",
  "naïve café résumé",
  "日本語のテキスト",
  "emoji 🙂🚀 ok",
  "def f(x):\n    return x**2  # square",
  "   \n  \n",
  "I'm you're they've we'll he'd",
  "HELLO'S",
  "a" * 50,
  "<|im_start|>user\nhi<|im_end|>",
  "x=1;y=2",
  "Ünïcödé ÀÉÎ",
  "\u00a0nbsp",
  "mixed123abc456",
  "  multiple   spaces   here  ",
  "Question: Natalia sold clips to 48 of her friends in April",
  "$1,234.56",
  "e.g. i.e. etc.",
  "tab\tsep\tvalues",
  "CRLF\r\nline",
  "🙂",
  "ab\u200bcd",
  "----- ===== #####",
  "<tool>calculator: 48/2</tool>",
  "FFF HHH GGG",
  "\n",
  " ",
  "ǅ ǈ",
  "Ⅻ ½ ²",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
  "مرحبا بالعالم",
  "Привет мир",
  "它是",
  "x\n\ny",
  "  \t  x",
  "<|endoftext|>end",
  "<|im_end|><|im_start|>assistant\n",
  "S F F F\nF H F H\n",
  "Answer: 72</answer>",
]
CHATS = [
  [{"role": "user", "content": "hi"}],
  [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
  [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
  ],
  [{"role": "user", "content": "text with <|im_end|> inside"}],
]


def _top(logits_TxV: torch.Tensor):
  logp = torch.log_softmax(logits_TxV.double(), -1)
  ids = torch.argsort(-logits_TxV, dim=-1, stable=True)[:, :TOP_K]
  return ids.int().numpy(), torch.gather(logp, 1, ids).float().numpy()


def _greedy(model, ids: list[int]):
  out, margins, past = [], [], None
  cur = torch.tensor([ids])
  with torch.no_grad():
    for _ in range(GREEDY):
      res = model(cur, past_key_values=past, use_cache=True)
      past, row = res.past_key_values, res.logits[0, -1]
      top2 = torch.topk(row, 2).values
      nxt = int(torch.argmax(row))
      out.append(nxt)
      margins.append(float(top2[0] - top2[1]))
      cur = torch.tensor([[nxt]])
  return np.asarray(out, np.int32), np.asarray(margins, np.float32)


def smollm2(out: pathlib.Path, gguf_path: str):
  folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
  tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(
    folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
  ).train(False)
  (out / "prompts").mkdir(parents=True, exist_ok=True)
  manifest = {
    "engine": f"transformers {transformers.__version__}, torch {torch.__version__}",
    "file": name,
    "top_k": TOP_K,
    "greedy_steps": GREEDY,
    "prompts": {},
  }
  for pid, (kind, spec) in PROMPTS.items():
    if kind == "chat":
      text = tok.apply_chat_template(spec, add_generation_prompt=True, tokenize=False)
      ids = tok.encode(text, add_special_tokens=False)
    else:
      ids = tok.encode(spec, add_special_tokens=False)
    with torch.no_grad():
      logits = model(torch.tensor([ids])).logits[0]
    top_ids, top_lp = _top(logits)
    greedy, margin = _greedy(model, ids)
    np.savez_compressed(
      out / "prompts" / f"{pid}.npz",
      input_ids=np.asarray(ids, np.int32),
      hf_top_ids=top_ids,
      hf_top_logprobs=top_lp,
      hf_greedy_ids=greedy,
      hf_greedy_top2_margin=margin,
    )
    manifest["prompts"][pid] = {
      "kind": kind,
      "spec": spec,
      "tokens": len(ids),
      "greedy_text": tok.decode(greedy),
    }
  (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
  tokenization = {"strings": STRINGS}
  for mode, split in (("plain", True), ("special", False)):
    tokenization[f"gguf_{mode}"] = [
      tok.encode(s, add_special_tokens=False, split_special_tokens=split) for s in STRINGS
    ]
  tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]
  )
  for mode, split in (("plain", True), ("special", False)):
    tokenization[f"hub_{mode}"] = [
      tok.encode(s, add_special_tokens=False, split_special_tokens=split) for s in STRINGS
    ]
  tokenization["chat"] = [
    {
      "messages": m,
      "text": tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
      "ids": tok.encode(
        tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
      ),
    }
    for m in CHATS
  ]
  (out / "tokenization.json").write_text(json.dumps(tokenization, ensure_ascii=False) + "\n")


def _perturb(model, seed: int):
  """Norm weights 1 + 0.1 N(0, 1) and biases 0.1 N(0, 1): transformers' init leaves them
  at 1 and 0, which would hide a norm or bias read from the wrong place."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
      elif name.endswith(".bias"):
        p.copy_(0.1 * torch.randn(p.shape, generator=gen))


TINY = dict(
  vocab_size=261,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  max_position_embeddings=512,
)


def tiny_models(out: pathlib.Path):
  configs = {
    "llama": transformers.LlamaConfig(
      **TINY,
      rope_theta=10_000.0,
      rms_norm_eps=1e-5,
      tie_word_embeddings=False,
      rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
      },
    ),
    "qwen2": transformers.Qwen2Config(
      **TINY, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True
    ),
    "qwen3": transformers.Qwen3Config(
      **TINY, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False
    ),
  }
  rng = np.random.default_rng(0)
  input_ids = rng.integers(0, 261, size=(2, 96)).astype(np.int64)
  for seed, (family, config) in enumerate(configs.items()):
    torch.manual_seed(seed)
    model = (
      AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().train(False)
    )
    _perturb(model, seed)
    path = out / "tiny" / family
    model.save_pretrained(path, safe_serialization=True)
    with torch.no_grad():
      logits = model(torch.from_numpy(input_ids)).logits.float().numpy()
    np.savez_compressed(path / "logits.npz", input_ids=input_ids.astype(np.int32), logits=logits)
    for extra in ("generation_config.json",):
      (path / extra).unlink(missing_ok=True)


def pre_tokenizer_splits(out: pathlib.Path):
  from tokenizers import Regex  # pylint: disable=g-import-not-at-top
  from transformers.integrations.gguf import gguf_tokenizer_mapping  # pylint: disable=g-import-not-at-top

  splits = {"strings": STRINGS}
  for name in ("llama-bpe", "qwen2"):
    regex = gguf_tokenizer_mapping.GGUF_PRE_TOKENIZER_SPLITS[name]
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
    splits[name] = [[piece for piece, _ in split.pre_tokenize_str(s)] for s in STRINGS]
  (out / "pre_tokenizers.json").write_text(json.dumps(splits, ensure_ascii=False) + "\n")


def main():
  out, gguf_path = pathlib.Path(sys.argv[1]), sys.argv[2]
  pre_tokenizer_splits(out)
  tiny_models(out)
  smollm2(out / "smollm2", gguf_path)
  print(json.dumps({"written": str(out)}))


if __name__ == "__main__":
  main()
