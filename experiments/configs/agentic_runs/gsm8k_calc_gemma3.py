"""GSM8K with a calculator tool (rlpost.envs.gsm8k_calc) on the real Gemma 3 270M: 2 solved
tool-call examples in the prompt (0 after the tool-trace SFT), up to 6 turns of 128 tokens,
held-out tasks the first 300 GSM8K test problems.

Command (after `python -m experiments.sft --config=experiments/configs/sft.py:gemma3_270m
--config.data.source=gsm8k_tools --config.data.data_dir=../shared/data/gsm8k
--config.data.seq_len=512 --workdir=SFT`):
  python -m experiments.agentic --config=experiments/configs/agentic.py:gsm8k_calc_gemma3 \
    --config.env.data_dir=../shared/data/gsm8k --config.model.init_from=SFT \
    --config.env.fewshot=0 --config.train.steps=16 --config.eval.every=16 \
    --config.train.compute_dtype=float32 --workdir=DIR

Result (greedy answers right, 300 test problems; experiments/results/gsm8k_calc.md): base
with 2 examples 0.7%, after the tool-trace SFT 3.3%, then 16 GRPO iterations 3.0%.
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  c = agentic.base("gsm8k_calc_gemma3", algo, agentic.gsm8k_calc_env(), total_tokens=320)
  c.rollout.max_turn_tokens = 128
  c.rollout.stop_strings = ()
  c.sampling.prompt_bucket = 128
  c.eval.num_tasks, c.eval.batch_tasks = 300, 32
  return c
