$PY -m experiments.grpo --config=experiments/configs/grpo_gsm8k.py:gemma3_270m --config.data.data_dir=$D \
  --config.data.template=chat --config.model.init_from=$R/sft --config.train.steps=20 \
  --config.checkpoint.every=5 --workdir=$R/grpo_rule
[ -f $R/grpo_rule/eval_gsm8k.json ] || $PY -m experiments.eval_gsm8k --workdir=$R/grpo_rule --num_problems=150 --pass_k=0 --base=False
