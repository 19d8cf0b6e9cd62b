#!/usr/bin/env bash
# Medusa heads and Hydra-style heads in decoding, at equal budget: the same subset of the heads recipe's
# self-distilled data, the same recipe (configs/smollm2_heads.yaml: 4 heads, draft vocabulary 8192, 3 epochs),
# one shared hidden-state cache; then tokens per step on Spec-Bench (untimed, every output checked) and a timed
# side-by-side run (plain, plain on the kernel, the heads, the Hydra-style heads; one process, interleaved).
#   bash experiments/hydra_vs_heads.sh [RECORDS] [QUESTIONS] [OUT]
set -euo pipefail
RECORDS=${1:-1600}
QUESTIONS=${2:-26}
OUT=${3:-runs/hydra_vs_heads}
PY=${PY:-.venv/bin/python}
MEDUSA=${MEDUSA:-.venv/bin/medusa-lite}
mkdir -p "$OUT"
stamp() { echo "[$(date +%T)] $*"; }

stamp "subset: $RECORDS records of the recipe's three files, shuffled with seed 0"
"$PY" - "$RECORDS" "$OUT/subset.jsonl" <<'PY'
import random, sys
files = ["data/self_distill/smollm2_gpu_selfdistill.jsonl", "data/self_distill/smollm2_selfdistill.jsonl",
         "data/self_distill/smollm2_tasks.jsonl"]
lines = [line for name in files for line in open(name, encoding="utf-8") if line.strip()]
random.Random(0).shuffle(lines)
open(sys.argv[2], "w", encoding="utf-8").writelines(lines[: int(sys.argv[1])])
PY

for kind in medusa_heads hydra; do
  stamp "train $kind"
  "$MEDUSA" train --config configs/smollm2_heads.yaml --data "$OUT/subset.jsonl" --drafter "$kind" \
    --hidden_cache_dir "$OUT/hidden_cache" --output_dir "$OUT/$kind" > "$OUT/train_$kind.log" 2>&1
  tail -n 2 "$OUT/train_$kind.log"
done

for kind in medusa_heads hydra; do
  stamp "Spec-Bench acceptance, $QUESTIONS questions: $kind"
  (cd experiments && "../$PY" spec_bench_acceptance.py --heads "../$OUT/$kind/heads" --quick "$QUESTIONS" \
    --out "../$OUT/acceptance_$kind") | tail -n 3
done

stamp "timed, $QUESTIONS questions: plain, plain_kernel, medusa (the subset heads), drafter (the subset Hydra heads)"
"$PY" infer/benchmark.py --quick "$QUESTIONS" --max-new-tokens 128 --dtype fp32 --threads 2 \
  --heads "$OUT/medusa_heads/heads" --methods plain plain_kernel medusa drafter --drafter "$OUT/hydra/heads" \
  --out "$OUT/timed" | tail -n 20
stamp done
