G="--config=experiments/configs/grpo_gsm8k.py:gemma3_270m --config.data.data_dir=$D --config.data.template=chat --num_problems=150 --pass_k=0"
[ -f $R/eval_sft.json ] || $PY -m experiments.eval_gsm8k $G --config.model.init_from=$R/sft --output=$R/eval_sft.json
[ -f $R/eval_base_chat.json ] || $PY -m experiments.eval_gsm8k $G --output=$R/eval_base_chat.json
