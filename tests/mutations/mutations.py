"""One-line mutations of the library that the suite must kill (issue 34's strength figure).

Each entry breaks one line the way a real bug would (a dropped factor, a swapped argument,
a sum for a mean, a dropped branch) and names the test files that guard that line. The
runner (`python -m tests.mutations.run`) applies one mutation at a time to a copy of the
tree and runs those files; a mutation is killed when a test fails (or the run hangs past
the timeout). Keep the list stable: a change that makes the suite faster must kill at
least as many of these as the suite before it, and each entry's files should stay the
files that test that module.

Fields: name, path (from the repository root), old (must occur exactly once in the file),
new, tests (test files to run), why (the bug it stands for).
"""

MUTATIONS = [
  # --- sampler
  dict(
    name="sampler_ignores_temperature",
    path="rlpost/sampling.py",
    old="  scaled = logits / config.temperature\n",
    new="  scaled = logits\n",
    tests=["tests/test_sampling.py", "tests/test_logprobs.py"],
    why="sampling at temperature 1 whatever the config says",
  ),
  dict(
    name="sampler_top_p_includes_current_token",
    path="rlpost/sampling.py",
    old="    mass_before = jnp.cumsum(probs, axis=0) - probs\n",
    new="    mass_before = jnp.cumsum(probs, axis=0)\n",
    tests=["tests/test_sampling.py"],
    why="nucleus cut one token too early (the mass before a token includes it)",
  ),
  dict(
    name="continued_turn_positions_skip_kept_tokens",
    path="rlpost/continuation.py",
    old="  next_pos = state.gen_pos_B + in_cache\n",
    new="  next_pos = state.gen_pos_B\n",
    tests=["tests/test_sampling.py", "tests/test_multiturn.py"],
    why="a later turn's new tokens placed as if the kept tokens of the last were not there",
  ),
  dict(
    name="continued_turn_keeps_tokens_after_the_stop",
    path="rlpost/continuation.py",
    old="  in_cache = jnp.minimum(kept_B, state.written)\n",
    new="  in_cache = jnp.broadcast_to(state.written, kept_B.shape)\n",
    tests=["tests/test_multiturn.py"],
    why="the tokens a stop string cut from a turn stay in the cache the next turn reads",
  ),
  dict(
    name="sampler_stop_token_not_kept",
    path="rlpost/sampling.py",
    old="  stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop\n",
    new="  stops_before = jnp.cumsum(is_stop, axis=-1)\n",
    tests=["tests/test_sampling.py", "tests/test_masks.py"],
    why="the stop token itself falls out of the completion mask",
  ),
  # --- policy losses, KL, aggregation, TIS
  dict(
    name="surrogate_min_for_max",
    path="rlpost/rl/losses.py",
    old="  loss_BxT = jnp.maximum(-adv_BxT * ratio_BxT, -adv_BxT * clipped_BxT)\n",
    new="  loss_BxT = jnp.minimum(-adv_BxT * ratio_BxT, -adv_BxT * clipped_BxT)\n",
    tests=["tests/test_losses.py", "tests/test_objectives.py"],
    why="the optimistic instead of the pessimistic clipped bound",
  ),
  dict(
    name="surrogate_clip_bounds_swapped",
    path="rlpost/rl/losses.py",
    old="  clipped_BxT = jnp.clip(ratio_BxT, 1.0 - epsilon_low, 1.0 + epsilon_high)\n",
    new="  clipped_BxT = jnp.clip(ratio_BxT, 1.0 - epsilon_high, 1.0 + epsilon_low)\n",
    tests=["tests/test_losses.py", "tests/test_objectives.py"],
    why="DAPO's asymmetric clip bounds swapped",
  ),
  dict(
    name="kl_k3_sign",
    path="rlpost/rl/losses.py",
    old="  return jnp.expm1(-diff) + diff\n",
    new="  return jnp.expm1(diff) + diff\n",
    tests=["tests/test_losses.py", "tests/test_objectives.py"],
    why="k3 estimator of KL(ref || policy) with the ratio inverted",
  ),
  dict(
    name="token_mean_is_sum",
    path="rlpost/rl/losses.py",
    old="  return jnp.sum(x_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)\n",
    new="  return jnp.sum(x_BxT)\n",
    tests=["tests/test_losses.py", "tests/test_objectives.py"],
    why="token-mean aggregation as a sum (a scale bug optimizers hide)",
  ),
  dict(
    name="tis_cap_ignored",
    path="rlpost/rl/losses.py",
    old="  w_BxT = jnp.minimum(jnp.exp(log_w_BxT), cap)\n",
    new="  w_BxT = jnp.exp(log_w_BxT)\n",
    tests=["tests/test_losses.py", "tests/test_objectives.py"],
    why="truncated importance sampling that never truncates",
  ),
  dict(
    name="value_loss_abs",
    path="rlpost/rl/losses.py",
    old="  unclipped_BxT = jnp.square(values_BxT - returns_BxT)\n",
    new="  unclipped_BxT = jnp.abs(values_BxT - returns_BxT)\n",
    tests=["tests/test_losses.py", "tests/test_critic.py", "tests/test_ppo.py"],
    why="value loss as an absolute error",
  ),
  # --- advantages and GAE
  dict(
    name="grpo_std_biased",
    path="rlpost/rl/advantages.py",
    old="  std_Px1 = jnp.std(r_PxG, axis=1, keepdims=True, ddof=1)\n",
    new="  std_Px1 = jnp.std(r_PxG, axis=1, keepdims=True, ddof=0)\n",
    tests=["tests/test_advantages.py", "tests/test_objectives.py"],
    why="the group std without Bessel's correction",
  ),
  dict(
    name="rloo_divides_by_g",
    path="rlpost/rl/advantages.py",
    old="  others_PxG = (sum_Px1 - r_PxG) / (group_size - 1)\n",
    new="  others_PxG = (sum_Px1 - r_PxG) / group_size\n",
    tests=["tests/test_advantages.py", "tests/test_objectives.py"],
    why="leave-one-out baseline divided by G instead of G - 1",
  ),
  dict(
    name="gae_drops_lambda",
    path="rlpost/rl/advantages.py",
    old="    adv_B = delta_B + gamma * lam * next_adv_B\n",
    new="    adv_B = delta_B + gamma * next_adv_B\n",
    tests=["tests/test_advantages.py", "tests/test_critic.py", "tests/test_ppo.py"],
    why="GAE with lambda fixed at 1",
  ),
  dict(
    name="gae_masked_not_transparent",
    path="rlpost/rl/advantages.py",
    old="    carry = (jnp.where(m_B, v_B, next_value_B), jnp.where(m_B, adv_B, next_adv_B))\n",
    new="    carry = (v_B, jnp.where(m_B, adv_B, next_adv_B))\n",
    tests=["tests/test_advantages.py", "tests/test_critic.py", "tests/test_ppo.py"],
    why="masked (observation) tokens' values leak into the bootstrap",
  ),
  # --- LoRA
  dict(
    name="lora_scale_ignores_rank",
    path="rlpost/models/lora.py",
    old="    return self.alpha / self.rank\n",
    new="    return self.alpha\n",
    tests=["tests/test_lora.py"],
    why="adapter scale alpha instead of alpha / rank",
  ),
  dict(
    name="lora_backward_drops_scale",
    path="rlpost/models/lora.py",
    old="  db = scale * mm(rows(xa).T, g_c)  # [r, n] @ [n, out]: the thin factor is the one transposed\n",
    new="  db = mm(rows(xa).T, g_c)  # [r, n] @ [n, out]: the thin factor is the one transposed\n",
    tests=["tests/test_lora.py"],
    why="the hand-written adapter backward forgets the scale on dB",
  ),
  # --- checkpoint verification
  dict(
    name="checkpoint_digest_not_verified",
    path="rlpost/train/checkpoint.py",
    old='  _verify(saved, digests(state), step_dir, "state")\n',
    new="  pass\n",
    tests=["tests/test_checkpoint.py"],
    why="restore trusts the array bytes without checking their CRCs",
  ),
  dict(
    name="checkpoint_layout_not_checked",
    path="rlpost/train/checkpoint.py",
    old="  if saved and saved != wanted:\n",
    new="  if False:\n",
    tests=["tests/test_checkpoint.py"],
    why="a checkpoint of another structure restored without StateMismatchError",
  ),
  # --- multi-turn batches
  dict(
    name="multiturn_observations_get_loss",
    path="rlpost/envs/multiturn.py",
    old="    loss_mask[r, :n] = row.sampled\n",
    new="    loss_mask[r, :n] = 1.0\n",
    tests=["tests/test_multiturn.py"],
    why="environment observation tokens trained on as if sampled",
  ),
  # --- off-policy pipeline
  dict(
    name="pipeline_samples_newest_version",
    path="rlpost/train/pipeline.py",
    old="        weights = published.weights[version]\n",
    new="        weights = published.weights[max(published.weights)]\n",
    tests=["tests/test_pipeline.py", "tests/test_grpo.py"],
    why="the producer samples with the newest policy, not the lagged one it reports",
  ),
  dict(
    name="pipeline_resume_seeds_current_policy",
    path="rlpost/recipes/rollout.py",
    old="        seeds = {v: publish(state, arrays[str(v)]) for v in needed}\n",
    new="        seeds = {v: publish(state, part(state)) for v in needed}\n",
    tests=["tests/test_pipeline.py", "tests/test_grpo.py"],
    why="a resumed pipelined run samples with the restored policy, not the saved lagged ones",
  ),
  # --- train step and sharding
  dict(
    name="train_step_sums_micro_batches",
    path="rlpost/train/step.py",
    old="  grads = jax.tree.map(lambda g: _mean_over(g / n, sharding.DATA, data), grads)\n",
    new="  grads = jax.tree.map(lambda g: _mean_over(g, sharding.DATA, data), grads)\n",
    tests=["tests/test_train.py"],
    why="gradients summed over micro-batches instead of averaged",
  ),
  dict(
    name="fsdp_gradient_not_divided",
    path="rlpost/train/step.py",
    old="    lambda g, s: g / fsdp if sharding.FSDP in s else _mean_over(g, sharding.FSDP, fsdp),\n",
    new="    lambda g, s: g if sharding.FSDP in s else _mean_over(g, sharding.FSDP, fsdp),\n",
    tests=["tests/test_sharding.py", "tests/test_distributed.py"],
    why="a split leaf's gradient left summed over the fsdp group",
  ),
  # --- model and masks
  dict(
    name="rmsnorm_without_one_plus",
    path="rlpost/models/decoder.py",
    old="    scale = offset + scale\n",
    new="    scale = scale\n",
    tests=["tests/test_gemma3.py", "tests/test_real_model.py"],
    why="Gemma's (1 + w) RMSNorm weight read as w",
  ),
  dict(
    name="packed_segments_attend_across",
    path="rlpost/ops/masks.py",
    old="  same_BxTxT = segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]\n",
    new="  same_BxTxT = segment_ids_BxT[:, :, None] >= segment_ids_BxT[:, None, :]\n",
    tests=["tests/test_masks.py", "tests/test_data_packing.py"],
    why="packed examples attend to the examples before them in the row",
  ),
  dict(
    name="logprobs_ignore_temperature",
    path="rlpost/ops/logprobs.py",
    old='  z_KxV = jnp.einsum("kd,vd->kv", h_c, e_c, preferred_element_type=jnp.float32) / temperature\n',
    new='  z_KxV = jnp.einsum("kd,vd->kv", h_c, e_c, preferred_element_type=jnp.float32)\n',
    tests=["tests/test_logprobs.py"],
    why="the trainer's logprobs at temperature 1 while the sampler's are not",
  ),
]
