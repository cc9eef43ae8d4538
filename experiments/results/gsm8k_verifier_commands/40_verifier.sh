$PY -m experiments.reward_model --config=experiments/configs/reward_model.py:gemma3_270m \
  --config.model.init_from=$R/sft --config.data.path=$R/pairs_train/pairs.jsonl \
  --config.data.eval_path=$R/pairs_test/pairs.jsonl --config.data.seq_len=384 \
  --config.train.steps=150 --config.eval.every=50 --config.eval.num_examples=400 \
  --config.checkpoint.every=25 --workdir=$R/verifier
