"""The endpoint's host-side pieces without a model: request checks, the chat seams, stop
strings, stream pieces, row ids and buckets, the scheduler's dropping of abandoned
requests, the client-gone check, the loopback rule, the serve config's checks."""

import concurrent.futures
import dataclasses
import json
import queue
import socket
import threading
import time
import types

import pytest

from conftest import import_main
from experiments.configs import serve as serve_configs
from rlpost import errors
from rlpost.models import families
from rlpost.serve import chat
from rlpost.serve import engine as engine_lib
from rlpost.serve import finish
from rlpost.serve import pool as pool_lib
from rlpost.serve import request_bodies
from rlpost.serve import responses
from rlpost.serve import scheduler
from rlpost.serve import server
from rlpost.serve import sessions
from rlpost.serve import streaming
from rlpost.serve import waiting
from rlpost.text import chat_formats
from rlpost.text import tokenizer as tokenizer_lib

serve_main = import_main("experiments.serve")

TOK = tokenizer_lib.byte_tokenizer("gemma")
ENGINE = engine_lib.Engine(None, families.get_config("tiny"), TOK, "tiny", 64, 16)
TOOL = {
  "type": "function",
  "function": {
    "name": "calculator",
    "description": "arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
  },
}


def _chat(**fields):
  return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_chat_request_fields():
  """Mutations caught: max_completion_tokens read after max_tokens; top_p read from
  temperature; n's default 1 -> 2."""
  gen = request_bodies.parse_chat(
    _chat(max_tokens=9, max_completion_tokens=7, temperature=0.5, top_p=0.25, seed=3, stop="x"),
    ENGINE,
  )
  assert gen.prompt_ids == tuple(
    chat_formats.conversation_ids(TOK, [{"role": "user", "content": "hi"}])
  )
  assert (gen.max_tokens, gen.temperature, gen.top_p, gen.seed, gen.stop, gen.n) == (
    7,
    0.5,
    0.25,
    3,
    ("x",),
    1,
  )
  assert request_bodies.parse_chat(_chat(), ENGINE).max_tokens == 16  # the engine's cap


@pytest.mark.parametrize(
  "fields, status, param",
  [
    (dict(model="other"), 404, "model"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(temperature="hot"), 400, "temperature"),
    (dict(n=0), 400, "n"),
    (dict(max_tokens=17), 400, "max_tokens"),
    (dict(top_logprobs=3), 400, "top_logprobs"),
    (dict(tool_choice="required"), 400, "tool_choice"),
    (dict(logit_bias={"5": 1}), 400, "logit_bias"),
    (dict(stop=["a", ""]), 400, "stop"),
    (dict(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role"),
    (
      dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
      400,
      "messages[0].content",
    ),
    (dict(messages=[{"role": "user", "content": "x" * 70}]), 400, "messages"),
    (dict(messages=[{"role": "user", "content": "x" * 40}], max_tokens=16), 400, "max_tokens"),
  ],
)
def test_bad_chat_fields_are_named(fields, status, param):
  """Mutation caught: the context check `room < 1` -> `room < -100` (the 70-byte prompt in a
  64-token context passes)."""
  with pytest.raises(request_bodies.ApiError) as e:
    request_bodies.parse_chat(_chat(**fields), ENGINE)
  assert (e.value.status, e.value.param) == (status, param)
  body = e.value.body()["error"]
  assert (
    set(body) == {"message", "type", "param", "code"} and param.split("[")[0] in body["message"]
  )


def test_unknown_fields_are_ignored_and_context_limit_named():
  gen = request_bodies.parse_chat(_chat(user="me", metadata={"a": 1}, store=False), ENGINE)
  assert gen.n == 1
  with pytest.raises(request_bodies.ApiError, match="context is 64 tokens"):
    request_bodies.parse_completion({"model": "tiny", "prompt": "y" * 80}, ENGINE)


def test_completion_prompt_forms():
  """Mutation caught: a token-id prompt re-encoded as text (`return prompt` ->
  `return engine.tokenizer.encode(str(prompt))`)."""
  assert request_bodies.parse_completion({"model": "tiny", "prompt": "ab"}, ENGINE).prompt_ids == (
    2,
    102,
    103,
  )
  gen = request_bodies.parse_completion(
    {"model": "tiny", "prompt": [[7, 8, 9]], "logprobs": 2}, ENGINE
  )
  assert (gen.prompt_ids, gen.logprobs, gen.top_logprobs) == ((7, 8, 9), True, 2)
  with pytest.raises(request_bodies.ApiError, match=r"prompt="):
    request_bodies.parse_completion({"model": "tiny", "prompt": [1, 999]}, ENGINE)


def test_tool_messages_render_in_the_library_syntax():
  """The seam today: tools in the system turn, a tool result as <result>, an assistant's
  tool_calls as <tool>NAME: ARG</tool>. Mutation caught: `_call_text` writing the raw
  arguments JSON instead of its one value."""
  messages = [
    {"role": "user", "content": "2+3?"},
    {
      "role": "assistant",
      "content": None,
      "tool_calls": [
        {
          "id": "c1",
          "type": "function",
          "function": {"name": "calculator", "arguments": json.dumps({"expression": "2+3"})},
        },
      ],
    },
    {"role": "tool", "content": "5", "tool_call_id": "c1"},
  ]
  ids = chat.prompt_ids(TOK, messages, (TOOL,))
  text = TOK.decode(ids, skip_special=False)
  assert "- calculator: arithmetic" in text
  assert "<start_of_turn>model\n<tool>calculator: 2+3</tool><end_of_turn>" in text
  assert "<start_of_turn>user\n<result>5</result><end_of_turn>" in text
  assert text.endswith("<start_of_turn>model\n")


def test_split_tool_calls():
  """Mutation caught: an unknown tool's call returned as a tool call (the name check
  dropped)."""
  content, calls = chat.split_tool_calls("Let me see. <tool>calculator: 2 * 3</tool>", (TOOL,))
  assert content == "Let me see. "
  assert calls[0]["function"] == {"name": "calculator", "arguments": '{"expression": "2 * 3"}'}
  assert chat.split_tool_calls("<tool>search: x</tool>", (TOOL,)) == ("<tool>search: x</tool>", [])
  assert chat.split_tool_calls("<tool>calculator: 1</tool>", ()) == (
    "<tool>calculator: 1</tool>",
    [],
  )


def _gen(**fields):
  base = dict(
    prompt_ids=(2,),
    n=1,
    max_tokens=8,
    temperature=0.0,
    top_p=1.0,
    stop=(),
    seed=0,
    logprobs=False,
    top_logprobs=0,
    stream=False,
    include_usage=False,
  )
  return request_bodies.Generation(**{**base, **fields})


def test_finish_cuts_at_stop_strings_and_reads_tool_calls():
  """Mutation caught: `text[:at]` -> `text[: at + len(stop)]` for a cut stop string."""
  ids = TOK.encode("abXYcd", add_bos=False)
  out = engine_lib.RowOutput(ids, [-1.0] * 6, None, False)
  c = finish.finish(TOK, _gen(stop=("XY",)), 0, out)
  assert (c.text, c.token_ids, c.finish_reason) == ("ab", ids[:4], "stop")
  assert finish.finish(TOK, _gen(), 0, out).finish_reason == "length"
  ids = TOK.encode("<tool>calculator: 1+1</tool> more", add_bos=False)
  c = finish.finish(
    TOK,
    _gen(tools=(TOOL,), keep_stops=("</tool>",)),
    0,
    engine_lib.RowOutput(ids, [0.0] * len(ids), None, False),
  )
  assert c.finish_reason == "tool_calls" and c.text == "<tool>calculator: 1+1</tool>"
  assert TOK.decode(c.token_ids) == c.text


def test_tool_calls_reach_the_client_response():
  """A chat request offering a tool, whose completion holds a call: the response (as the
  `openai` client reads it) has the call as tool_calls, finish_reason tool_calls, content
  before it, and the ids cut after the call's close; with tool_choice none the text stays
  content. (Was an end-to-end test over a faked sampler; the decode path is in
  test_serve_slots.) Mutation caught: chat.stop_strings returning () (the call still
  parses, but the ids and text run on past its close)."""
  import openai  # pylint: disable=g-import-not-at-top

  engine = dataclasses.replace(ENGINE, context=1024)  # the tool's description is long
  ids = TOK.encode("ok <tool>calculator: 6*7</tool> more", add_bos=False)
  out = engine_lib.RowOutput(ids, [0.0] * len(ids), None, False)
  for choice, want in (("auto", "tool_calls"), ("none", "length")):
    gen = request_bodies.parse_chat(_chat(tools=[TOOL], tool_choice=choice), engine)
    c = finish.finish(TOK, gen, 0, out)
    body = responses.chat_response(TOK, gen, "tiny", [c])
    r = openai.types.chat.ChatCompletion.model_validate(body).choices[0]
    assert r.finish_reason == want
  assert r.message.content == TOK.decode(ids) and not r.message.tool_calls  # tool_choice none
  gen = request_bodies.parse_chat(_chat(tools=[TOOL]), engine)
  c = finish.finish(TOK, gen, 0, out)
  r = openai.types.chat.ChatCompletion.model_validate(
    responses.chat_response(TOK, gen, "tiny", [c])
  ).choices[0]
  assert r.message.content == "ok " and r.model_extra["token_ids"] == c.token_ids
  call = r.message.tool_calls[0]
  assert (call.function.name, json.loads(call.function.arguments)) == (
    "calculator",
    {"expression": "6*7"},
  )
  assert TOK.decode(c.token_ids) == "ok <tool>calculator: 6*7</tool>"


def _streamed(gen, ids):
  """The (ids, text) pieces a stream sends for `ids` decoded one token per chunk, then
  the flush when the choice ends."""
  c = finish.finish(TOK, gen, 0, engine_lib.RowOutput(ids, [0.0] * len(ids), None, False))
  sent, held, pieces = streaming.Sent(), streaming.holds(gen), []
  for k in range(1, len(c.token_ids) + 1):
    piece = streaming.progress(TOK, sent, ids[:k], held)
    pieces += [(ids[piece[0] : piece[1]], piece[2])] if piece else []
  lo, hi, text = streaming.rest(sent, c)
  return c, pieces + [(c.token_ids[lo:hi], text)]


def test_stream_pieces_add_up_to_the_text():
  """Streamed pieces concatenate to the choice's text and ids; a multi-byte character
  waits for its last byte; the start of a stop string waits until it is known not to be
  one. Mutations caught: safe_end's suffix check dropped (the `!` of the cut `!Z` is
  sent), its U+FFFD loop dropped (half an `é` is sent)."""
  ids = TOK.encode("hé!Z!", add_bos=False)
  c, pieces = _streamed(_gen(stop=("!Z",)), ids)
  assert "".join(t for _, t in pieces) == c.text == "hé"
  assert sum((list(i) for i, _ in pieces), []) == c.token_ids
  assert all("\ufffd" not in t for _, t in pieces) and len(pieces) >= 2
  c, pieces = _streamed(_gen(), TOK.encode("a!b", add_bos=False))
  assert [t for _, t in pieces[:3]] == ["a", "!", "b"]  # nothing held without stops


def test_stream_holds_a_tool_call_back():
  """With tools, text from a call opener on is held and the call comes in the last chunk;
  the content before it streams. Mutation caught: holds() leaving out the call openers."""
  gen = _gen(tools=(TOOL,), keep_stops=("</tool>",))
  ids = TOK.encode("ok <tool>calculator: 1</tool>", add_bos=False)
  c, pieces = _streamed(gen, ids)
  assert c.tool_calls and c.content == "ok "
  assert [t for _, t in pieces if t] == ["o", "k", " "]
  last = responses.last_chunk({}, c, chat=True)["choices"][0]
  assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"][0]["index"] == 0


def test_row_ids_and_buckets():
  """Mutation caught: row_id ignoring the choice index (n choices all the same)."""
  assert engine_lib.row_id(7, 0) == engine_lib.row_id(7, 0) != engine_lib.row_id(7, 1)
  assert 0 <= engine_lib.row_id(2**62, 3) < 2**31
  assert [engine_lib.bucket(n, 16) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]
  assert [engine_lib.bucket(n, 1) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]


def test_abandoned_requests_are_not_decoded():
  """A request whose caller cancelled it before its batch leaves the batch. Mutation
  caught: `_collect` keeping every future (no set_running_or_notify_cancel filter)."""
  inbox = queue.Queue()
  kept, dropped = concurrent.futures.Future(), concurrent.futures.Future()
  dropped.cancel()
  inbox.put((_gen(), dropped))
  inbox.put((_gen(), kept))
  config, awaited = scheduler.BatchConfig(batch_window_ms=1), scheduler.Awaited()
  batch = scheduler._collect(inbox, config, threading.Event(), awaited)
  assert [f for _, f in batch] == [kept]


def test_a_closed_client_is_noticed_while_waiting():
  """Mutation caught: `waiting.client_gone` returning False always (the request would be kept
  and decoded for nobody)."""
  a, b = socket.socketpair()
  future = concurrent.futures.Future()
  try:
    assert not waiting.client_gone(a)
    b.close()
    assert waiting.wait(future, a, 5.0) is None
    assert future.cancelled()
  finally:
    a.close()


def test_remote_hosts_need_allow_remote():
  """Mutation caught: the loopback check dropped from ServerConfig.__post_init__."""
  with pytest.raises(ValueError, match=r"host='0.0.0.0'.*allow_remote=True"):
    server.ServerConfig(host="0.0.0.0")
  assert server.ServerConfig(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"
  assert server.is_loopback("::1") and server.is_loopback("localhost")
  cfg = serve_configs.get_config("tiny")
  with cfg.unlocked():
    cfg.host = "10.0.0.5"
  with pytest.raises(errors.ConfigError, match=r"config.host='10.0.0.5'"):
    serve_main.check_config(cfg)
  cfg = serve_configs.get_config("tiny")
  with cfg.unlocked():
    cfg.max_batch = 0
  with pytest.raises(errors.ConfigError, match=r"config.max_batch=0"):
    serve_main.check_config(cfg)


def test_session_segments_follow_the_sampled_tokens():
  """Turns that extend the record join it (new prompt tokens masked, sampled ones trained
  with their logprobs); a turn that does not starts a segment and counts a break.
  Mutation caught: the prefix comparison dropped (`if tokens and False`), so the edited
  history's tokens would be appended as if they extended the record."""
  t1 = sessions.Turn((1, 2), (3, 4), (-0.5, -0.25))
  t2 = sessions.Turn((1, 2, 3, 4, 9), (5,), (-1.0,))
  t3 = sessions.Turn((1, 7), (8,), (-2.0,))
  segs, breaks = sessions.segments([t1, t2, t3])
  assert breaks == 1
  assert segs[0] == sessions.Segment(
    (1, 2, 3, 4, 9, 5), (0, 0, 1, 1, 0, 1), (0.0, 0.0, -0.5, -0.25, 0.0, -1.0)
  )
  assert segs[1] == sessions.Segment((1, 7, 8), (0, 0, 1), (0.0, 0.0, -2.0))
  assert sessions.split_path("/sessions/ep-1/v1/chat/completions") == (
    "ep-1",
    "/v1/chat/completions",
  )
  assert sessions.split_path("/v1/models") == (None, "/v1/models")
  assert sessions.split_path("/sessions/a b/v1/models")[0] is None


def test_warm_up_compiles_every_bucket(monkeypatch):
  """Every (rows admitted together, prefill width) bucket up to the limits at every column
  count: a fresh admission, a chunk of that many rows, a session's continuation. Mutations
  caught: `powers` stopping below its upper bound (`while lo < hi`); admission_rows
  rounding to powers of four (8 live rows decoded as 16: twice a real model's unembedding)."""
  seen = []
  lanes = [pool_lib.Lane(cached=(2,) * 40) for _ in range(8)]
  pool = types.SimpleNamespace(columns=256, slots=None, write_index=0, lanes=lanes)
  monkeypatch.setattr(pool_lib, "new_pool", lambda *a: pool)
  monkeypatch.setattr(pool_lib.engine_lib, "for_decoding", lambda engine: engine)
  monkeypatch.setattr(pool_lib, "step", lambda *a: seen.append("step") or [])
  monkeypatch.setattr(pool_lib, "release", lambda *a, **k: None)
  monkeypatch.setattr(pool_lib, "live", lambda *a: [])
  monkeypatch.setattr(pool_lib.slots_lib, "compact", lambda *a, **k: None)

  def admit(engine, pool, placed, width, end):
    seen.append((len(placed), width, "continued" if placed[0][2] else "fresh"))

  monkeypatch.setattr(pool_lib, "_admit_device", admit)
  assert pool_lib.warm_up(ENGINE, 8, 40) == 16  # 40 + 16 new + 64 + 1 + 16: 128, 256 columns
  pairs = [(r, w) for w in (32, 64) for _ in (128, 256) for r in (1, 2, 4, 8)]
  assert seen == [x for r, w in pairs for x in ((r, w, "fresh"), "step", (r, w, "continued"))]
  assert [pool_lib.admission_rows(n, 32) for n in (1, 2, 3, 5, 8, 17, 40)] == [
    1,
    2,
    4,
    8,
    8,
    32,
    32,
  ]


def test_a_burst_stays_one_batch():
  """Requests arriving 100 ms apart join one batch under a 250 ms gap although they
  spread over 300 ms; a lone request waits one gap. Mutation caught: the gap measured
  from the first request (`now >= first + window` for `last + window`)."""
  inbox, stopping = queue.Queue(), threading.Event()
  config = scheduler.BatchConfig(max_batch=8, batch_window_ms=250, max_wait_ms=5000)

  def feed():
    for _ in range(4):
      inbox.put((_gen(), concurrent.futures.Future()))
      stopping.wait(0.1)

  feeder = threading.Thread(target=feed)
  feeder.start()
  batch = scheduler._collect(inbox, config, stopping, scheduler.Awaited())
  feeder.join()
  assert len(batch) == 4


def test_an_admission_prefills_powers_of_two_rows_not_padding(monkeypatch):
  """Five fresh jobs and three of sessions whose lanes keep their history, admitted at once
  into eight slots: prefills of 4 + 1 fresh rows and 2 + 1 continued ones, never 5 rows
  padded to 8 (copies of one row, prefilled for nothing). Mutation caught: `_parts`
  returning `[placed]` (`n = len(placed) - done`)."""
  lanes = [pool_lib.Lane(cached=(1, 2, 3), session=f"s{i}") for i in range(3)]
  pool = types.SimpleNamespace(lanes=lanes + [pool_lib.Lane() for _ in range(5)])
  pool.write_index, pool.columns = 8, 256
  calls = []
  monkeypatch.setattr(
    pool_lib, "_admit_device", lambda e, p, placed, w, end: calls.append((len(placed), w, end))
  )
  jobs = [pool_lib.Job((1, 2, 3, 4), 4, 0, f"s{i}", None) for i in range(3)]
  jobs += [pool_lib.Job((5, 6), 4, 0, None, None) for _ in range(5)]
  assert pool_lib.admit(ENGINE, pool, jobs) == []
  assert calls == [(4, 32, 32), (1, 32, 32), (2, 32, 32), (1, 32, 32)]


def test_a_batch_waits_for_the_episodes_it_awaits():
  """Three episodes announced (`expect`): their first requests come 150 ms apart, far past
  the 20 ms gap, and still make one batch; the third episode ends without a request
  (`forget`), which closes the batch long before max_wait_ms. Mutation caught: `_more`
  closing at the gap whatever is awaited (`and not awaited.sessions` dropped)."""
  inbox, stopping = queue.Queue(), threading.Event()
  config = scheduler.BatchConfig(max_batch=8, batch_window_ms=20, max_wait_ms=5000)
  served = types.SimpleNamespace(inbox=inbox, awaited=scheduler.Awaited())
  scheduler.expect(served, ["a", "b", "c"])

  def episodes():
    scheduler.submit(served, _gen(), "a")
    stopping.wait(0.15)
    scheduler.submit(served, _gen(), "b")
    stopping.wait(0.15)
    scheduler.forget(served, "c")

  feeder = threading.Thread(target=episodes)
  start = time.monotonic()
  feeder.start()
  batch = scheduler._collect(inbox, config, stopping, served.awaited)
  feeder.join()
  assert [f.session for _, f in batch] == ["a", "b"]
  assert time.monotonic() - start < 2.0 and not served.awaited.sessions


def _qwen():
  import pathlib  # pylint: disable=g-import-not-at-top
  from rlpost.text import chat_template  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(__file__).parent / "fixtures" / "chat_templates" / "qwen2_5.json"
  fix = json.loads(path.read_text(encoding="utf-8"))
  return chat_template.ChatTemplate(fix["template"], "qwen2_5", None, "<|im_end|>")


def test_with_a_chat_template_the_prompt_is_its_rendering_and_calls_its_format():
  """A ChatSetup with Qwen2.5's template: the prompt ids are the template's rendering
  (tools in its system turn; an assistant's `tool_calls` with JSON-text arguments written
  as the template writes an object; `tool` messages as <tool_response>), the native format
  is hermes (no stop strings: several calls end at the end of turn), and a completion's
  calls become OpenAI tool_calls, a malformed one leaving the text as content. Mutation
  caught: split_tool_calls ignoring the setup's format (the library syntax read)."""
  from rlpost.text import template_ids  # pylint: disable=g-import-not-at-top

  tok = tokenizer_lib.byte_tokenizer("chatml")
  setup = chat.setup(_qwen())
  assert setup.tool_format == "hermes" and chat.stop_strings((TOOL,), setup) == ()
  call = {"id": "call00000", "type": "function"}
  call["function"] = {"name": "calculator", "arguments": '{"expression": "2+3"}'}
  messages = [
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [call]},
    {"role": "tool", "tool_call_id": "call00000", "content": "5"},
  ]
  want_call = {**call, "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
  want = template_ids.conversation_ids(
    setup.template,
    tok,
    [messages[0], {**messages[1], "tool_calls": [want_call]}, messages[2]],
    tools=[TOOL],
    add_generation_prompt=True,
    date_string=setup.date_string,
  )
  got = chat.prompt_ids(tok, messages, (TOOL,), setup)
  assert got == want
  text = tok.decode(got, skip_special=False)
  assert '"name": "calculator"' in text and "<tool_response>\n5\n</tool_response>" in text
  two = (
    'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}'
    '</tool_call><tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
  )
  content, calls = chat.split_tool_calls(two, (TOOL,), setup)
  assert content == "Let me see. " and [json.loads(c["function"]["arguments"]) for c in calls] == [
    {"expression": "1+1"},
    {"expression": "2*3"},
  ]
  broken = "<tool_call>{broken</tool_call>"
  assert chat.split_tool_calls(broken, (TOOL,), setup) == (broken, [])
