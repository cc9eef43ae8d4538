"""The endpoint end to end: one server on the tiny model for the module, driven by the real
`openai` client (raw `http.client` and sockets for malformed input and disconnects)."""

import concurrent.futures
import http.client
import json
import socket
import time
import types
import urllib.parse

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest

from rlpost import sampling
from rlpost.models import policy
from rlpost.rl import batch as batch_lib
from rlpost.models import decoder
from rlpost.models import loading
from rlpost.serve import agents
from rlpost.serve import engine as engine_lib
from rlpost.serve import scheduler
from rlpost.serve import scoring
from rlpost.serve import server
from rlpost.serve import sessions
from rlpost.text import chat_formats

CONTEXT = 256
MAX_CONCURRENT = 8


@pytest.fixture(scope="module")
def served():
  config, params, tok = loading.load_model("tiny", "random")
  engine = engine_lib.Engine(params, config, tok, "tiny", CONTEXT, 64)
  settings = server.ServerConfig(port=0, max_concurrent=MAX_CONCURRENT, max_body_bytes=4096)
  with server.serve_in_thread(engine, settings, scheduler.BatchConfig(16, 50.0)) as endpoint:
    client = openai.OpenAI(base_url=endpoint.url, api_key="-", max_retries=0, timeout=120)
    yield types.SimpleNamespace(
      url=endpoint.url, endpoint=endpoint, engine=engine, client=client, tok=tok
    )


def _raw(served, method, path, body=b"", headers=None):
  """(status, parsed JSON) of one raw HTTP request."""
  parts = urllib.parse.urlparse(served.url)
  conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
  try:
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    return response.status, json.loads(response.read())
  finally:
    conn.close()


def _sampler(engine, prompt, max_tokens, temperature=0.0, seed=0):
  """The library's own sampler on one prompt: (ids, logprobs) of choice 0 of `seed`."""
  tok = engine.tokenizer
  config = sampling.SamplingConfig(
    temperature=temperature, stop_ids=(tok.eos_id, tok.end_of_turn_id), max_new_tokens=max_tokens
  )
  tokens, lengths = sampling.pad_prompts([list(prompt)], config)
  out = sampling.sample(
    engine.params,
    tokens,
    lengths,
    jax.random.key(0),
    row_ids=jnp.asarray([engine_lib.row_id(seed, 0)], jnp.int32),
    model_config=engine.model_config,
    config=config,
  )
  n = int(out.lengths[0])
  return out.tokens[0, :n].tolist(), np.asarray(out.logprobs[0, :n])


@pytest.mark.slow
def test_greedy_chat_equals_the_library_sampler(served):
  """The prompt ids are the chat layout's and the greedy ids the sampler's on them.
  Mutation caught: engine.generate padding `list(r.prompt)[1:]` (a token dropped)."""
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
  r = served.client.chat.completions.create(
    model="tiny", messages=messages, max_tokens=12, temperature=0
  )
  extra = r.model_extra
  assert extra["prompt_token_ids"] == chat_formats.conversation_ids(served.tok, messages)
  ids = r.choices[0].model_extra["token_ids"]
  assert ids == _sampler(served.engine, extra["prompt_token_ids"], 12)[0]
  assert r.choices[0].message.content == served.tok.decode(ids)
  assert r.usage.completion_tokens == len(ids) and r.usage.prompt_tokens == len(
    extra["prompt_token_ids"]
  )
  assert r.choices[0].finish_reason == ("stop" if len(ids) < 12 else "length")


def _teacher_forced(engine, prompt, ids, temperature):
  """log_softmax(logits / T) [len(ids), V] of a plain full forward over prompt + ids."""
  seq = jnp.asarray([list(prompt) + list(ids)], jnp.int32)
  S = seq.shape[1]
  mask = jnp.tril(jnp.ones((S, S), bool))[None]
  logits, _ = decoder.forward(
    engine.params, seq, jnp.arange(S)[None], mask, config=engine.model_config
  )
  return jax.nn.log_softmax(logits[0, len(prompt) - 1 : S - 1] / temperature, axis=-1)


@pytest.mark.slow
def test_logprobs_equal_a_teacher_forced_forward(served):
  """Sampled (T=0.7, seed 5) tokens' logprobs and top_logprobs against a full forward.
  Mutations caught: scoring.top_logprobs without `/ temperature`; the sampler's
  logprobs replaced by the top list's first entry (responses reading `c.top[t][0][1]`)."""
  r = served.client.chat.completions.create(
    model="tiny",
    messages=[{"role": "user", "content": "The cat"}],
    max_tokens=10,
    temperature=0.7,
    seed=5,
    logprobs=True,
    top_logprobs=3,
  )
  c = r.choices[0]
  prompt, ids = r.model_extra["prompt_token_ids"], c.model_extra["token_ids"]
  ref = np.asarray(_teacher_forced(served.engine, prompt, ids, 0.7))
  entries = c.logprobs.content
  assert [e.token for e in entries] == [served.tok.decode([i], skip_special=False) for i in ids]
  np.testing.assert_allclose([e.logprob for e in entries], ref[np.arange(len(ids)), ids], atol=1e-3)
  for t, e in enumerate(entries):
    want = np.argsort(-ref[t])[:3]
    np.testing.assert_allclose([a.logprob for a in e.top_logprobs], ref[t, want], atol=1e-3)
  assert ids == _sampler(served.engine, prompt, 10, 0.7, seed=5)[0]


def _request(served, spec):
  kind, prompt, max_tokens, temperature, seed, n = spec
  if kind == "chat":
    r = served.client.chat.completions.create(
      model="tiny",
      messages=[{"role": "user", "content": prompt}],
      max_tokens=max_tokens,
      temperature=temperature,
      seed=seed,
      n=n,
    )
  else:
    r = served.client.completions.create(
      model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, n=n
    )
  return [c.model_extra["token_ids"] for c in r.choices]


@pytest.mark.slow
def test_concurrent_requests_match_one_at_a_time(served):
  """Requests arriving together decode side by side in one slot pool, and every choice
  equals the one the request gets alone (greedy and seeded; different prompt lengths,
  token budgets and n). Mutation caught: row_id ignoring the seed (`f"{index}"`)."""
  specs = [
    ("chat", "Hi", 5, 0.0, None, 1),
    ("chat", "A much longer question, padded more", 20, 0.0, None, 1),
    ("completion", "x = ", 12, 0.9, 11, 2),
    ("completion", "x = ", 12, 0.9, 12, 1),
    ("chat", "Tell me", 9, 0.9, 11, 1),
    ("completion", "abc", 7, 0.0, None, 1),
  ]
  alone = [_request(served, s) for s in specs]
  stats = served.endpoint.scheduler.stats
  stats["max_live"] = 0
  with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:
    together = list(pool.map(lambda s: _request(served, s), specs))
  assert together == alone
  assert stats["max_live"] > 1
  assert alone[2][0] != alone[2][1] and alone[2][0] != alone[3][0]  # seeds and choices differ


@pytest.mark.slow
def test_stream_equals_the_whole_response(served):
  """Streamed deltas add up to the non-streamed content and ids; usage comes last when
  asked; the raw stream ends with `data: [DONE]`. Mutation caught: the [DONE] line not
  written."""
  kwargs = dict(
    model="tiny", messages=[{"role": "user", "content": "Go"}], max_tokens=10, temperature=0
  )
  whole = served.client.chat.completions.create(**kwargs)
  chunks = list(
    served.client.chat.completions.create(
      **kwargs, stream=True, stream_options={"include_usage": True}
    )
  )
  text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  ids = sum((ch.choices[0].model_extra.get("token_ids") or [] for ch in chunks if ch.choices), [])
  assert (
    text == whole.choices[0].message.content and ids == whole.choices[0].model_extra["token_ids"]
  )
  assert chunks[-1].usage.completion_tokens == len(ids)
  assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[
    0
  ].finish_reason
  raw = _stream_bytes(served, {**kwargs, "stream": True})
  assert raw.rstrip().endswith(b"data: [DONE]")


def _stream_bytes(served, body, keep=None):
  """The raw bytes of a streaming request (the first `keep` bytes, then the socket is
  closed)."""
  parts = urllib.parse.urlparse(served.url)
  data = json.dumps(body).encode()
  with socket.create_connection((parts.hostname, parts.port), timeout=60) as s:
    s.sendall(
      b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      + f"Content-Length: {len(data)}\r\n\r\n".encode()
      + data
    )
    out = b""
    while chunk := s.recv(65536):
      out += chunk
      if keep is not None and len(out) >= keep:
        break
  return out


@pytest.mark.slow
def test_stop_strings_and_finish_reasons(served):
  """A stop string cuts the text and the ids (finish_reason stop); max_tokens gives
  length. Mutation caught: finish() keeping the whole text after a stop string."""
  base = dict(model="tiny", prompt="0123", max_tokens=16, temperature=0)
  full = served.client.completions.create(**base).choices[0]
  stop = full.text[4:6]
  cut = served.client.completions.create(**base, stop=[stop]).choices[0]
  assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
  assert (
    full.model_extra["token_ids"][: len(cut.model_extra["token_ids"])]
    == cut.model_extra["token_ids"]
  )
  short = served.client.completions.create(**{**base, "max_tokens": 3}).choices[0]
  assert short.finish_reason == "length" and len(short.model_extra["token_ids"]) == 3


@pytest.mark.slow
def test_bad_input_never_stops_the_server(served):
  """Malformed JSON 400, a non-object 400, unknown model 404, a prompt past the context 400
  naming it, an oversized body 413, an unknown route 404, each an OpenAI error body; then
  a client that disconnects mid-stream, MAX_CONCURRENT + 1 times, and the next request is
  served. Mutation caught: do_POST's `finally: self.app.slots.release()` dropped (the
  ninth request gets 429)."""
  post = lambda body, path="/v1/chat/completions": _raw(
    served, "POST", path, body, {"Content-Type": "application/json"}
  )  # noqa: E731
  cases = [
    (post(b"{not json"), 400, "invalid_json"),
    (post(b"[1, 2]"), 400, "invalid_json"),
    (
      post(json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode()),
      404,
      "model_not_found",
    ),
    (
      post(
        json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "y" * 300}]}).encode()
      ),
      400,
      "context_length_exceeded",
    ),
    (post(b"{" + b" " * 5000 + b"}"), 413, "request_too_large"),
    (post(b"{}", "/v1/embeddings"), 404, "not_found"),
  ]
  for (status, body), want_status, code in cases:
    assert status == want_status and body["error"]["code"] == code, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
  assert str(CONTEXT) in cases[3][0][1]["error"]["message"]
  with pytest.raises(openai.NotFoundError):
    served.client.chat.completions.create(
      model="gpt-9", messages=[{"role": "user", "content": "x"}]
    )
  body = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Go"}],
    "max_tokens": 30,
    "temperature": 0,
    "stream": True,
  }
  for _ in range(MAX_CONCURRENT + 1):
    assert _stream_bytes(served, body, keep=20).startswith(b"HTTP/1.1 200")
  r = served.client.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "Go"}], max_tokens=4
  )
  assert len(r.choices[0].model_extra["token_ids"]) >= 1


def test_api_key_and_models(served):
  """With an api_key, a request without it gets 401 and with it the model list. Mutations
  caught: `_authorized` returning True always; a refused POST's body left unread (the
  next request on the connection would read it as its request line)."""
  settings = server.ServerConfig(port=0, api_key="sesame")
  with server.serve_in_thread(served.engine, settings, scheduler.BatchConfig()) as endpoint:
    url = endpoint.url
    bad = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
      bad.models.list()
    good = openai.OpenAI(base_url=url, api_key="sesame", max_retries=0)
    assert [m.id for m in good.models.list()] == ["tiny"]
    parts = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:  # a refused POST's body is read: the kept-alive connection serves the next request
      conn.request("POST", "/v1/completions", body=b'{"model": "tiny"}')
      refused = conn.getresponse()
      assert (
        refused.status == 401 and json.loads(refused.read())["error"]["code"] == "invalid_api_key"
      )
      conn.request("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})
      response = conn.getresponse()
      assert response.status == 200 and json.loads(response.read())["data"][0]["id"] == "tiny"
    finally:
      conn.close()


@pytest.mark.slow
def test_a_session_records_the_sampled_tokens(served):
  """An agent on a session URL, token in and token out: turn 2's prompt is turn 1's prompt,
  its sampled ids and new ids; turn 3 starts over: two segments, one break, each
  segment's loss tokens exactly the sampled ids. (A chat agent sending back decoded text
  breaks the prefix wherever re-encoding does not give the sampled ids back, as the
  tiny model's random bytes do.) Mutation caught: sessions.record never called (the
  `session is not None` branch dropped)."""
  client = openai.OpenAI(base_url=served.endpoint.session_url("ep-1"), api_key="-", max_retries=0)
  prompts, sampled = [served.tok.encode("Hi")], []
  for turn in range(3):
    r = client.completions.create(model="tiny", prompt=prompts[-1], max_tokens=6, temperature=0)
    sampled.append(r.choices[0].model_extra["token_ids"])
    more = served.tok.encode(" more", add_bos=False)
    prompts.append(prompts[-1] + sampled[-1] + more if turn == 0 else served.tok.encode("Again"))
  segments, breaks = sessions.segments(sessions.take(served.endpoint.recorder, "ep-1"))
  assert (len(segments), breaks) == (2, 1)
  loss = [[t for t, m in zip(s.tokens, s.loss_mask) if m] for s in segments]
  assert loss == [sampled[0] + sampled[1], sampled[2]]
  assert list(segments[0].tokens) == prompts[1] + sampled[1]
  assert list(segments[1].tokens) == prompts[2] + sampled[2]
  assert sessions.take(served.endpoint.recorder, "ep-1") == []


def _agent(client, task):
  """A test agent by task kind: two turns token in, token out (reward: tokens sampled), or
  one that raises, hangs past the timeout or returns NaN after one request."""
  prompt, total = list(task["prompt"]), 0
  for _ in range(2 if task["kind"] == "ok" else 1):
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
    ids = r.choices[0].model_extra["token_ids"]
    prompt = r.model_extra["prompt_token_ids"] + ids + [110]
    total += len(ids)
  if task["kind"] == "raise":
    raise RuntimeError("boom")
  if task["kind"] == "hang":
    time.sleep(9)
  return float("nan") if task["kind"] == "nan" else total


async def _async_agent(client, task):
  r = await client.completions.create(model="tiny", prompt=task["prompt"], max_tokens=3)
  return len(r.choices[0].model_extra["token_ids"])


@pytest.mark.slow
def test_agents_play_episodes_and_failures_stay_their_own(served):
  """Agents through the openai client: a good episode's segments hold its sampled tokens;
  an agent that raises, hangs past timeout_s or returns NaN gets a named error and weight
  0 while the others finish; an async agent works. Mutation caught: `weight = 0.0 if error
  else 1.0` -> `weight = 1.0`."""
  prompt = served.tok.encode("Go")
  tasks = [{"kind": k, "prompt": prompt} for k in ("ok", "raise", "hang", "nan", "ok")]
  config = agents.AgentConfig("unused:run", timeout_s=6.0, threads=8)  # compiles fit in it
  episodes = agents.play(served.endpoint, _agent, tasks, config)
  ok, raised, hung, nan, ok2 = episodes
  for e in (ok, ok2):
    assert (e.error, e.weight, e.prefix_breaks, len(e.segments)) == (None, 1.0, 0, 1)
    assert e.reward == sum(e.segments[0].loss_mask) > 0
  (a,), (b,) = ok.segments, ok2.segments  # greedy: the same tokens, each in its own session
  assert (a.tokens, a.loss_mask) == (b.tokens, b.loss_mask)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)  # prefills of 4 and 1 rows
  assert "RuntimeError: boom" in raised.error and "timed out" in hung.error
  assert "finite" in nan.error
  assert [e.weight for e in (raised, hung, nan)] == [0.0, 0.0, 0.0]
  (one,) = agents.play(served.endpoint, _async_agent, [{"prompt": prompt}], config)
  assert one.error is None and one.reward == sum(one.segments[0].loss_mask)
  with pytest.raises(ValueError, match="agent=.no_colon.: write it as MODULE:FUNCTION"):
    agents.load("no_colon")
  assert agents.load("json:dumps") is json.dumps


def _sampling_agent(client, task):
  """Three turns token in, token out at temperature 0.7 (a seed per turn)."""
  prompt = list(task["prompt"])
  for turn in range(3):
    r = client.completions.create(
      model="tiny", prompt=prompt, max_tokens=5, temperature=0.7, seed=task["seed"] + turn
    )
    prompt = r.model_extra["prompt_token_ids"] + r.choices[0].model_extra["token_ids"] + [110, 111]
  return 1.0


@pytest.mark.slow
def test_recorded_episodes_train_on_what_was_sampled(served):
  """Agent episodes as RLBatch rows: the trainer's logprobs of the loss tokens (the
  policy's teacher-forced forward at the sampling temperature) equal the sampler's
  recorded ones, so the first importance ratio is 1. Mutation caught: sessions.rows
  reading each sampled logprob one token early (`s.logprobs[k - 1 : -1]`)."""
  tasks = [{"prompt": served.tok.encode(w), "seed": 10 * i} for i, w in enumerate(("A", "Bcd"))]
  episodes = agents.play(served.endpoint, _sampling_agent, tasks, agents.AgentConfig("x:y"))
  segments = [s for e in episodes for s in e.segments]
  assert len(segments) == 2 and all(e.prefix_breaks == 0 for e in episodes)
  batch = batch_lib.RLBatch(**sessions.rows(segments, served.tok.pad_id))
  assert batch.loss_mask.sum() == sum(sum(s.loss_mask) for s in segments) >= 6
  fwd = policy.ForwardConfig(served.engine.model_config, temperature=0.7)
  logp = policy.completion_logprobs_jit(served.engine.params, None, batch_lib.to_device(batch), fwd)
  on = batch.loss_mask > 0
  np.testing.assert_allclose(np.asarray(logp)[on], batch.sampler_logp[on], atol=1e-3)


@pytest.mark.slow
def test_top_logprobs_do_not_depend_on_the_chunk(served, monkeypatch):
  """A logits budget forcing 3-position chunks (10 positions: a ragged last chunk) gives
  the same alternatives as 16-position ones. Mutation caught: the padding `-N % chunk`
  -> `N % chunk` (a reshape error or shifted rows)."""
  e = served.engine
  prompt, lengths = sampling.pad_prompts([served.tok.encode("Hello")], sampling.SamplingConfig())
  sampled = jnp.asarray([served.tok.encode("abcdefghij", add_bos=False)], jnp.int32)
  mask = jnp.ones(sampled.shape, bool)
  kwargs = dict(model_config=e.model_config, temperature=1.0, k=4)
  whole = scoring.top_logprobs(e.params, prompt, lengths, sampled, mask, **kwargs)
  monkeypatch.setattr(scoring, "LOGITS_BUDGET", 3 * e.model_config.vocab_size)
  fresh = jax.jit(scoring.top_logprobs.__wrapped__, static_argnames=tuple(kwargs))  # retraced
  parts = fresh(e.params, prompt, lengths, sampled, mask, **kwargs)
  np.testing.assert_array_equal(whole[0], parts[0])
  np.testing.assert_allclose(whole[1], parts[1], atol=1e-6)
