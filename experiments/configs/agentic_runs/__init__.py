"""One config module per reproduced agentic experiment (big_vision style): each module's
`get_config(ALGORITHM)` returns its ConfigDict, its docstring the command and the result.
`experiments/configs/agentic.py:ENV_MODEL[,ALGORITHM]` dispatches to them by name."""
