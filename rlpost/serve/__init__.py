"""An OpenAI-compatible endpoint serving the policy (issue 68).

engine.py          Engine (model, tokenizer, limits); generate(): one batched sampler call
                   over rows sharing a sampling setting, bucketed shapes; warm_up()
scoring.py         top-k logprobs of sampled tokens by one teacher-forced forward
chat.py            the two seams: messages -> prompt ids, completion text -> tool_calls
request_bodies.py  request JSON -> Generation (checked; ApiError names the field)
finish.py          a row's tokens -> a choice: stop strings, text, finish_reason
responses.py       OpenAI response and stream-chunk JSON (vLLM's token ids)
scheduler.py       the one thread that owns the model: batches concurrent requests
sessions.py        a session's prompt and sampled ids; segments that train (prefix breaks)
agents.py          user agents (run(client, task) -> reward) played as recorded episodes
server.py          the HTTP server (stdlib ThreadingHTTPServer), routes, limits, SSE
"""
