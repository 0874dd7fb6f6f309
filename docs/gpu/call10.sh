#!/bin/bash
# Tenth device call (one H200): `--mesh auto` end to end on a GPU host after the layer-memory
# device fix (e3c22e6): the default model, then gpt3-xl at seq 2048 as on the H100 (call 5).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
stamp train --mesh auto default model
timeout 100 python3 scripts/train.py --mesh auto --steps 20 --no-progress --metrics-file $OUT/mesh_auto_default.jsonl >>$L 2>&1; stamp "rc=$?"
stamp train --mesh auto gpt3-xl
timeout 150 python3 scripts/train.py --mesh auto --model gpt3-xl --set model.vocab_size=50304 --batch-size 8 --seq-len 2048 --precision bf16 --steps 4 --eval-every 0 --no-progress --metrics-file $OUT/mesh_auto_gpt3_xl_h200.jsonl >>$L 2>&1; stamp "rc=$?"
nvidia-smi --query-gpu=name,memory.used --format=csv >>$L 2>&1
stamp end
