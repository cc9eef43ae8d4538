# The model's own samples are almost never right (4 of 1024 train, 1 of 400 test), so the
# main figure uses each problem's correct solution (the pairs' chosen: mostly the
# reference) labelled true beside its wrong samples; the threshold is fitted on the first
# 64 train problems' rows. Then the 400 test samples as sampled (natural labels).
for split in train test; do
  $PY - $R/pairs_$split/pairs.jsonl $R/pairs_$split/labelled_with_chosen.jsonl <<'PYEOF'
import json, sys
seen, out = set(), []
for line in open(sys.argv[1]):
  r = json.loads(line)
  if r["prompt"] not in seen:
    seen.add(r["prompt"])
    out.append({"system": r["system"], "prompt": r["prompt"], "completion": r["chosen"], "label": True})
  out.append({"system": r["system"], "prompt": r["prompt"], "completion": r["rejected"], "label": False})
with open(sys.argv[2], "w") as f:
  f.writelines(json.dumps(r) + "\n" for r in out)
PYEOF
done
head -n 320 $R/pairs_train/labelled_with_chosen.jsonl > $R/pairs_train/labelled_with_chosen_first.jsonl
[ -f $R/verifier_eval_with_chosen.json ] || $PY -m experiments.verifier_eval --workdir=$R/verifier \
  --fit=$R/pairs_train/labelled_with_chosen_first.jsonl --examples=$R/pairs_test/labelled_with_chosen.jsonl \
  --seq_len=512 --output=$R/verifier_eval_with_chosen.json
[ -f $R/verifier_eval.json ] || $PY -m experiments.verifier_eval --workdir=$R/verifier \
  --fit=$R/pairs_train/labelled_with_chosen_first.jsonl --examples=$R/pairs_test/examples.jsonl \
  --seq_len=512 --output=$R/verifier_eval.json
