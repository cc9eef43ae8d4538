"""rlpost: post-training for language models as pure JAX functions over explicit pytrees.

Where things live (one job per module; floors in tests/test_layering.py):
  text/        tokenizer, bpe, vocabularies, chat_formats, scaffold (token ids around
               environment text), tool_syntax: how text is encoded, below data/ and envs/
  models/      decoder (the one forward of every family: init, forward, cache), families
               (name -> presets, chat format), gemma3 / llama (their Configs and presets),
               lora, policy (ForwardConfig, trainable vs frozen), critic (PPO value head and
               layouts), quant (the sampler's int8 copy), loading, weights/ (gguf, safetensors,
               a family's weight map): a new model family goes here
  ops/         logprobs (chunked, never [B, T, V]), masks (causal, segment, completion)
  sampling.py  SamplingConfig; sample = prefill + lax.while_loop decode
  continuation.py  later turns continue the KV cache: start, extend, take_rows
  rl/          batch (the typed RLBatch), advantages and credit (RULES: every credit rule by
               name; a new estimator is a function and one line), losses (POLICY_LOSSES,
               KL_ESTIMATORS, AGGREGATIONS tables: a new loss goes here), objectives
               (GRPOConfig / PPOConfig and their loss functions), the learners' updates
               (learner, grpo_update, ppo_update)
  envs/        multi-turn environments (protocol, FrozenLake, tools, calculator, GSM8K with a
               calculator, tool traces) and the token-in/token-out rollout; table (ENVS): a
               new environment is a module here and an entry there
  rewards/     reward functions `(prompts, completions, answers) -> list[float]`, scoring
  data/        GSM8K, synthetic tasks, chat records, packing, the resumable cursor
  supervised/  sft, dpo and their losses
  train/       step (TrainState, the one jitted train step), loop (the one run loop),
               checkpoint, metrics, host_memory, sharding / shares / distributed (devices and
               processes), pipeline (off-policy rollouts), compute_paths / runtime (per machine)
  recipes/     the only modules that read ConfigDicts. Recipes: rl (every RL run: a prompt
               dataset or an environment, a learner from learners.LEARNERS), sft, dpo, eval;
               their helpers: learners (grpo, ppo: a new learner is an entry there), rollout
               (sampler weights, off-policy schedule), reports (metrics, transcripts),
               blocks (typed config blocks), supervised_run (what sft and dpo share),
               common (from_block, train / checkpoint blocks, model, optimizer). No
               recipe imports another.
  errors.py    UsageError and its kinds: what the mains print as one FATAL line

Shape suffixes on names at public boundaries (`tokens_BxS`, `logp_BxT`):
  B  rows of a batch (sequences; in RL often N = B * G)
  N  rows of an RL batch (B prompts x G samples, prompt-major)
  G  samples per prompt (group size)
  P  context (prompt) slots, left-padded
  T  completion slots (or tokens of a row, where there is no prompt/completion split)
  S  all slots of a row (P + T), or cache slots in the sampler
  V  vocabulary size
  D  model width
  K  tokens in one chunk of the output projection (or candidates in top-k sampling)
  L  layers
  M  gathered loss tokens of a micro-batch (SFT)
"""
