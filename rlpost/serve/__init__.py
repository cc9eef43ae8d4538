"""An OpenAI-compatible endpoint serving the policy (issue 68).

engine.py          Engine (model, tokenizer, limits), its decode layout made once, row
                   ids, buckets, top-k alternatives
slots.py           the device side of continuous batching: row slots over one KV cache;
                   admit (prefill into slots), step_chunk (k decode steps), compact
pool.py            a sampler setting's slots on the host: which request each decodes,
                   sessions' kept slots (a next turn prefills only its new tokens), warm_up
scheduler.py       the one thread that owns the model: admits, decodes by chunks, finishes;
                   awaits the first requests of agents started together (expect)
scoring.py         top-k logprobs of sampled tokens by one teacher-forced forward
chat.py            the two seams: messages -> prompt ids, completion text -> tool_calls
request_bodies.py  request JSON -> Generation (checked; ApiError names the field)
finish.py          a row's tokens -> a choice: stop strings, text, finish_reason
streaming.py       what a stream may send while a choice decodes (stop strings, tool calls held)
responses.py       OpenAI response and stream-chunk JSON (vLLM's token ids)
sessions.py        a session's prompt and sampled ids; segments that train (prefix breaks)
agents.py          user agents (run(client, task) -> reward) played as recorded episodes
server.py          the HTTP server (stdlib ThreadingHTTPServer), routes, limits, SSE
"""
