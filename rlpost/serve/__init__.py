"""An OpenAI-compatible endpoint serving the policy (issue 68).

engine.py     Engine (the model, its tokenizer, limits); generate(): one batched sampler
              call over rows sharing a sampling setting, bucketed shapes
scoring.py    top-k logprobs of sampled tokens by one teacher-forced forward
chat.py       the two seams: messages -> prompt ids, completion text -> tool_calls
requests.py   request JSON -> Generation (checked; ApiError names the field)
finish.py     a row's tokens -> choice: stop strings, max_tokens, text, finish_reason
responses.py  OpenAI response and stream-chunk JSON
scheduler.py  the one thread that owns the model: batches concurrent requests
server.py     the HTTP server (stdlib ThreadingHTTPServer), routes, limits, SSE
"""
