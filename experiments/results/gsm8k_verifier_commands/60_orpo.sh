$PY -m experiments.dpo --config=experiments/configs/dpo.py:gemma3_270m --config.loss=orpo \
  --config.model.init_from=$R/sft --config.data.path=$R/pairs_train/pairs.jsonl \
  --config.data.seq_len=384 --config.train.steps=100 --config.checkpoint.every=25 --workdir=$R/orpo
[ -f $R/eval_orpo.json ] || $PY -m experiments.eval_gsm8k --config=experiments/configs/grpo_gsm8k.py:gemma3_270m \
  --config.data.data_dir=$D --config.data.template=chat --num_problems=150 --pass_k=0 \
  --config.model.init_from=$R/orpo --output=$R/eval_orpo.json
