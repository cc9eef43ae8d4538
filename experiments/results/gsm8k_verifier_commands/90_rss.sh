[ -f $R/preference_losses_full.json ] || $PY -m experiments.benchmarks.preference_losses --variant=gemma3_270m \
  --data=$R/pairs_train/pairs.jsonl --steps=5 --lora=False --eval_pairs=16 > $R/preference_losses_full.json.tmp \
  && mv $R/preference_losses_full.json.tmp $R/preference_losses_full.json
