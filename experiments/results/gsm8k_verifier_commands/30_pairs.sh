G="--config=experiments/configs/grpo_gsm8k.py:gemma3_270m --config.data.data_dir=$D --config.data.template=chat --config.model.init_from=$R/sft --samples=4"
$PY -m experiments.outcome_pairs $G --split=train --num_problems=256 --out=$R/pairs_train
$PY -m experiments.outcome_pairs $G --split=test --num_problems=100 --out=$R/pairs_test
