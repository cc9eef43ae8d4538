$PY -m experiments.grpo --config=experiments/configs/grpo_gsm8k.py:gemma3_270m --config.data.data_dir=$D \
  --config.data.template=chat --config.model.init_from=$R/sft --config.train.steps=20 \
  --config.reward_model.path=$R/verifier --config.reward_model.rule_weight=0 \
  --config.checkpoint.every=5 --workdir=$R/grpo_verifier
[ -f $R/grpo_verifier/eval_gsm8k.json ] || $PY -m experiments.eval_gsm8k --workdir=$R/grpo_verifier --num_problems=150 --pass_k=0 --base=False
