$PY -m experiments.sft --config=experiments/configs/sft.py:gemma3_270m --config.data.data_dir=$D \
  --config.train.steps=200 --config.checkpoint.every=20 --workdir=$R/sft
