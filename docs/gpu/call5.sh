#!/bin/bash
# Fifth device call: scripts/train.py --mesh auto on one H100 for gpt3-xl, where the planner's
# predicted choice (remat=none, accumulation 2) ran out of memory in call 4: the compile check
# must drop it and train with a plan that fits.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
stamp train --mesh auto gpt3-xl
timeout 220 python3 scripts/train.py --mesh auto --model gpt3-xl --set model.vocab_size=50304 --batch-size 8 --seq-len 2048 --precision bf16 --steps 4 --eval-every 0 --no-progress --metrics-file $OUT/mesh_auto_gpt3_xl.jsonl >>$L 2>&1; stamp "rc=$?"
nvidia-smi --query-gpu=name,memory.used --format=csv >>$L 2>&1
stamp end
