"""A textarena opponent that asks a model behind an OpenAI-compatible endpoint for player
1's move: served by `experiments.serve` from the policy's starting weights, it makes
TicTacToe self-play with one side frozen (the served copy never trains).

  python -m experiments.serve --config=experiments/configs/serve.py:gemma3_270m  # logs its URL
  RLPOST_OPPONENT_URL=http://127.0.0.1:PORT/v1 python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/textarena_gemma3.py:grpo \
    --config.env.opponent=experiments.examples.endpoint_opponent:move --workdir=DIR

The prompt is player 1's observation as the policy reads its own (the env's cue after it,
no chat template: `/v1/completions`); a reply is sampled at RLPOST_OPPONENT_TEMPERATURE
(default 1.0) with the request seeded by the game's seed and turn, so an episode replays.
A reply the game refuses becomes the random legal move (`info["opponent_fallbacks"]`).
Needs only the `openai` client; RLPOST_OPPONENT_MODEL names the served model (default: the
endpoint's first).
"""

import functools
import os

import openai

MAX_TOKENS = 8  # a TicTacToe move, "[4]", is 2-3 tokens


@functools.cache
def _client(url: str) -> openai.OpenAI:
  return openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=120)


@functools.cache
def _model(url: str) -> str:
  return os.environ.get("RLPOST_OPPONENT_MODEL") or _client(url).models.list().data[0].id


def move(observation: str, seed: int, turn: int) -> str:
  """Player 1's reply to `observation` (any text; the game reads the move in it)."""
  url = os.environ.get("RLPOST_OPPONENT_URL", "http://127.0.0.1:8000/v1")
  reply = _client(url).completions.create(
    model=_model(url),
    prompt=observation,
    max_tokens=MAX_TOKENS,
    temperature=float(os.environ.get("RLPOST_OPPONENT_TEMPERATURE", "1.0")),
    seed=seed * 1000 + turn,
  )
  return reply.choices[0].text
