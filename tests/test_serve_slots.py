"""Continuous batching (rlpost/serve/slots.py, pool.py): rows joining a running pool, a
session's turn continuing from its kept slot, true streaming, and a gone client's slot
freed. The reference is always `sampling.sample` on one prompt alone."""

import socket
import time
import types

import numpy as np
import openai
import pytest

from rlpost.models import decoder
from rlpost.models import loading
from rlpost.serve import engine as engine_lib
from rlpost.serve import pool as pool_lib
from rlpost.serve import scheduler
from rlpost.serve import server
from test_serve import _sampler as _alone  # the library's sampler on one prompt alone


@pytest.fixture(scope="module")
def tiny():
  config, params, tok = loading.load_model("tiny", "random")
  return engine_lib.Engine(params, config, tok, "tiny", 512, 256)


def _job(prompt, budget, seed, session=None):
  return pool_lib.Job(tuple(prompt), budget, engine_lib.row_id(seed, 0), session, None)


def _run(engine, pool, arrivals: dict, steps: int = 4) -> dict:
  """Decodes jobs arriving before chunk k (`arrivals[k]`) until all end; {id(job): lane
  (ids, logprobs)}."""
  waiting, out, k = [], {}, 0
  while k <= max(arrivals) or waiting or pool_lib.live(pool):
    waiting = pool_lib.admit(engine, pool, waiting + arrivals.get(k, []))
    if pool_lib.live(pool):
      ended = pool_lib.step(engine, pool, steps)
      out.update(
        {id(pool.lanes[i].job): (pool.lanes[i].ids, pool.lanes[i].logprobs) for i in ended}
      )
      pool_lib.release(pool, ended, cancel=False)
    k += 1
  return out


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rows_joining_mid_decode_equal_the_sampler_alone(tiny, temperature):
  """Five rows into four slots, admitted before chunks 0, 1, 2 and 3 (the fifth waits for a
  slot and takes a freed one; the cache is compacted on the way): each row's tokens and
  logprobs equal the sampler's on its prompt alone. Mutations caught: a row's key counter
  the shared write index instead of its own count (sampled); an admitted row attending the
  previous occupant's columns (`kept` not cut to keep_A); a chunk over every slot (decoded
  in place) read as if its rows were the live ones first (`zip(range(len(rows)), rows)`)."""
  tok = tiny.tokenizer
  words = ("Hello there", "A", "Some longer prompt text here, friend", "xyz", "Q")
  budgets = (24, 16, 30, 20, 10)
  jobs = [_job(tok.encode(w), b, s) for s, (w, b) in enumerate(zip(words, budgets))]
  pool = pool_lib.new_pool(tiny, temperature, 1.0, 4, pool_lib.new_stats(), 64)  # compacts
  out = _run(tiny, pool, {0: jobs[:2], 1: jobs[2:3], 2: jobs[3:4], 3: jobs[4:]})
  for seed, job in enumerate(jobs):
    ids, logprobs = out[id(job)]
    want_ids, want_logprobs = _alone(tiny, job.prompt, job.budget, temperature, seed)
    assert ids == want_ids, seed
    np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5)
  assert pool.stats["compactions"] >= 1 and pool.stats["max_live"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_session_continues_from_its_slot(tiny, temperature):
  """Three turns of a session (turn 3 edits the end of turn 2's reply) beside another
  row each turn: every turn equals the sampler on the whole prompt re-prefilled, and only
  the new suffix is prefilled (turn 2: the reply's last token and the new ones; turn 3:
  from the edit on). Mutation caught: the new tokens' positions restarting at 0 (keep_A
  dropped from admit's positions)."""
  tok = tiny.tokenizer
  pool = pool_lib.new_pool(tiny, temperature, 1.0, 2, pool_lib.new_stats())
  prompt, more, prefilled = tok.encode("Hi there"), tok.encode(" more", add_bos=False), []
  for turn in range(3):
    before = pool.stats["prefilled_tokens"]
    job, other = _job(prompt, 10, 7 + turn, "s1"), _job(tok.encode(f"other {turn}"), 30, 50 + turn)
    out = _run(tiny, pool, {0: [job, other]})
    prefilled.append(pool.stats["prefilled_tokens"] - before - len(other.prompt))
    ids, logprobs = out[id(job)]
    want_ids, want_logprobs = _alone(tiny, prompt, 10, temperature, 7 + turn)
    assert ids == want_ids, turn
    np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5)
    edit = 2 if turn == 1 else 0  # turn 3's prompt drops the reply's last two tokens
    prompt = prompt + ids[: len(ids) - edit] + more
  assert prefilled == [len(tok.encode("Hi there")), 1 + len(more), len(more)]
  assert pool.stats["cache_hits"] == 2
  assert pool.stats["cache_misses"] == 1


@pytest.mark.slow
def test_slots_decode_from_layers_laid_out_once(tiny, monkeypatch):
  """With every layer big enough to unroll (`UNROLL_MIN_LAYER_BYTES` 0), the scheduler's
  engine (`for_decoding`) holds the layers unstacked, the slot programs lay nothing out
  again (no `unstack_layers` while they trace), and three rows admitted at once (prefills
  of 2 + 1 rows, `pool._parts`) and one joining later still equal the sampler alone.
  Mutation caught: `for_decoding` returning the engine as given (every admission and chunk
  copies the layers again: Gemma 3 270M's 0.13-0.25 s a call)."""
  monkeypatch.setattr(decoder, "UNROLL_MIN_LAYER_BYTES", 0)
  decoder._decoding_layers.clear_cache()  # traced at the default threshold elsewhere
  decoding = engine_lib.for_decoding(tiny)
  assert isinstance(decoding.params["layers"], tuple)
  laid_out = []
  unstack = decoder.unstack_layers
  monkeypatch.setattr(decoder, "unstack_layers", lambda p: laid_out.append(1) or unstack(p))
  tok = tiny.tokenizer
  words = ("Laid out", "once", "x y z", "and later")
  jobs = [_job(tok.encode(w), 12, s) for s, w in enumerate(words)]
  pool = pool_lib.new_pool(decoding, 0.0, 1.0, 4, pool_lib.new_stats(), 64)
  out = _run(decoding, pool, {0: jobs[:3], 1: jobs[3:]})
  decoder._decoding_layers.clear_cache()
  assert not laid_out
  for seed, job in enumerate(jobs):
    assert out[id(job)][0] == _alone(tiny, job.prompt, job.budget, 0.0, seed)[0], seed


@pytest.fixture(scope="module")
def one_slot(tiny):
  """A server with ONE row slot (a second request waits for it), chunks of 4 steps."""
  batch = scheduler.BatchConfig(max_batch=1, batch_window_ms=1.0, max_wait_ms=1.0, chunk_steps=4)
  with server.serve_in_thread(tiny, server.ServerConfig(port=0), batch) as endpoint:
    host, port = endpoint.url.split("//")[1].split("/")[0].split(":")
    client = openai.OpenAI(base_url=endpoint.url, api_key="-", max_retries=0, timeout=120)
    yield types.SimpleNamespace(endpoint=endpoint, address=(host, int(port)), client=client)


def _sse(address, body: bytes, stop_after_content: bool = False):
  """[(seconds since the request, event bytes)] of a raw streaming request; with
  `stop_after_content` the socket is closed after the first content event."""
  events, buffer = [], b""
  with socket.create_connection(address, timeout=60) as s:
    start = time.perf_counter()
    s.sendall(
      b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      + f"Content-Length: {len(body)}\r\n\r\n".encode()
      + body
    )
    while chunk := s.recv(65536):
      buffer += chunk
      while b"\n\n" in buffer:
        event, buffer = buffer.split(b"\n\n", 1)
        if b"data: " in event:
          events.append((time.perf_counter() - start, event[event.index(b"data: ") + 6 :]))
          if stop_after_content and b'"token_ids": [' in events[-1][1]:
            return events
  return events


def _body(max_tokens: int) -> bytes:
  return (
    b'{"model": "tiny", "prompt": "Stream", "temperature": 0, "stream": true, "max_tokens": '
    + str(max_tokens).encode()
    + b"}"
  )


@pytest.mark.slow
def test_the_stream_arrives_as_it_is_decoded(one_slot):
  """With 200 tokens to decode (chunks of 4), the first content event arrives in the first
  half of the stream's time (a third, unloaded), not with the rest. Mutation caught: the scheduler sending no
  token updates (`_send_tokens`'s `if ... gen.stream:` -> `if False:`: the text comes when
  the row ends)."""
  for _ in range(2):  # compiles the shapes the stream meets (the pool's sizes settle)
    _sse(one_slot.address, _body(200))
  events = _sse(one_slot.address, _body(200))
  content = [t for t, e in events if b'"token_ids": [' in e and b'"token_ids": []' not in e]
  assert events[-1][1] == b"[DONE]" and len(content) >= 3
  assert content[0] < events[-1][0] / 2  # all at once (the mutation): content[0] ~ the end


@pytest.mark.slow
def test_a_client_gone_mid_stream_frees_its_slot(one_slot):
  """A client that closes its stream after the first content event: its row stops at the
  next chunk, and the next request is served in the one slot it frees, long before the 200
  tokens the first asked for would have been decoded. Mutation caught: the scheduler never
  releasing gone rows (`if _gone(...) and False`)."""
  stats = one_slot.endpoint.scheduler.stats
  chunks, cancelled = stats["chunks"], stats["cancelled"]
  assert _sse(one_slot.address, _body(200), stop_after_content=True)
  r = one_slot.client.completions.create(model="tiny", prompt="abc", max_tokens=3, temperature=0)
  assert len(r.choices[0].model_extra["token_ids"]) >= 1
  assert stats["cancelled"] == cancelled + 1
  assert stats["chunks"] - chunks < 200 // 4 // 2


@pytest.mark.slow
def test_the_stream_client_benchmark_measures_a_real_stream(one_slot):
  """`experiments.benchmarks.stream_client` (the same client code for llama.cpp's server)
  against our endpoint: the tokens it counts (each event's `token_ids`) are the completion's,
  the first before the stream's end. Mutation caught: `stream_once` counting one token per
  text chunk on our server too (the byte model's characters hold several tokens back)."""
  from experiments.benchmarks import stream_client  # pylint: disable=g-import-not-at-top

  url = one_slot.endpoint.url
  got = stream_client.stream_once(url, "tiny", 24)
  want = one_slot.client.completions.create(
    model="tiny", prompt=stream_client.PROMPT, max_tokens=24, temperature=0
  )
  assert got["tokens"] == len(want.choices[0].model_extra["token_ids"]) >= 2
  assert 0 < got["ttft_s"] and got["stream_s"] > 0
