"""What a session's requests sampled, as token ids, and the episode segments they make.

An agent talks to `/sessions/{id}/v1/...` (the base URL its environment hands it); every
request's prompt ids and each choice's sampled ids and logprobs are recorded under the
id. `segments` turns a session's turns into what trains: token in, token out. Turn k's
prompt normally extends everything before it (the last prompt and its sampled tokens);
then only its new tokens join, as context (loss_mask 0), and its sampled tokens follow
(loss_mask 1, their sampler logprobs kept). When an agent edits or re-renders its
history so that a prompt does not extend the recorded tokens, a new segment starts
there (each trained on its own sampled tokens) and the break is counted.
"""

import dataclasses
import re
import threading

import numpy as np

SESSION_PATH = re.compile(r"^/sessions/([A-Za-z0-9_.\-]{1,128})(/v1/.*)$")


@dataclasses.dataclass(frozen=True)
class Turn:
  """One request of a session: its prompt ids and choice 0's sampled ids and logprobs."""

  prompt: tuple[int, ...]
  sampled: tuple[int, ...]
  logprobs: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Segment:
  """A trainable sequence: tokens, loss_mask (1 on sampled tokens), logprobs (the
  sampler's on sampled tokens, 0 elsewhere); all the same length."""

  tokens: tuple[int, ...]
  loss_mask: tuple[int, ...]
  logprobs: tuple[float, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Recorder:
  """Turns by session id, guarded by a lock (handler threads record concurrently), and
  the ids of closed sessions (a timed-out agent's late requests are not kept)."""

  turns: dict = dataclasses.field(default_factory=dict)
  closed: set = dataclasses.field(default_factory=set)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def split_path(path: str) -> tuple[str | None, str]:
  """`/sessions/ID/v1/x` -> (ID, `/v1/x`); any other path -> (None, path)."""
  match = SESSION_PATH.match(path)
  return (match.group(1), match.group(2)) if match else (None, path)


def record(recorder: Recorder, session: str, turn: Turn) -> None:
  with recorder.lock:
    if session not in recorder.closed:
      recorder.turns.setdefault(session, []).append(turn)


def take(recorder: Recorder, session: str, close: bool = False) -> list[Turn]:
  """The session's turns in arrival order, forgotten by the recorder; with `close`, later
  requests of the session are not recorded."""
  with recorder.lock:
    if close:
      recorder.closed.add(session)
    return recorder.turns.pop(session, [])


def segments(turns: list[Turn]) -> tuple[list[Segment], int]:
  """(segments, prefix breaks) of a session's turns (module docstring)."""
  out, breaks = [], 0
  tokens, mask, logp = [], [], []
  for turn in turns:
    if tokens and list(turn.prompt[: len(tokens)]) != tokens:
      out.append(Segment(tuple(tokens), tuple(mask), tuple(logp)))
      tokens, mask, logp = [], [], []
      breaks += 1
    new = list(turn.prompt[len(tokens) :])
    tokens += new + list(turn.sampled)
    mask += [0] * len(new) + [1] * len(turn.sampled)
    logp += [0.0] * len(new) + list(turn.logprobs)
  if tokens:
    out.append(Segment(tuple(tokens), tuple(mask), tuple(logp)))
  return out, breaks


def rows(segments: list[Segment], pad_id: int, context_bucket: int = 1, width_bucket: int = 1):
  """The fields of an `rl.batch.RLBatch` holding one segment per row (numpy): context =
  a segment's tokens before its first sampled one, left-padded to the widest (rounded up
  to a multiple of `context_bucket`); completion = the rest (sampled tokens, and the
  observations between them with loss_mask 0), right-padded (to a multiple of
  `width_bucket`). tokens/positions [N, P + T] int32, valid [N, P + T] bool, loss_mask and
  sampler_logp [N, T] float32."""
  starts = [s.loss_mask.index(1) if 1 in s.loss_mask else len(s.tokens) for s in segments]
  P = -(-max(starts) // context_bucket) * context_bucket
  T = max(len(s.tokens) - k for s, k in zip(segments, starts))
  T = -(-max(T, 1) // width_bucket) * width_bucket
  N = len(segments)
  tokens = np.full((N, P + T), pad_id, np.int32)
  valid = np.zeros((N, P + T), bool)
  loss = np.zeros((N, T), np.float32)
  logp = np.zeros((N, T), np.float32)
  for i, (s, k) in enumerate(zip(segments, starts)):
    lo, hi = P - k, P + len(s.tokens) - k
    tokens[i, lo:hi] = s.tokens
    valid[i, lo:hi] = True
    loss[i, : hi - P] = s.loss_mask[k:]
    logp[i, : hi - P] = s.logprobs[k:]
  positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
  return {
    "tokens": tokens,
    "positions": positions,
    "valid": valid,
    "loss_mask": loss,
    "sampler_logp": logp,
  }
