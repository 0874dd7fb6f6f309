#!/bin/bash
# Fourth device call: the planner's predictions after the memory fixes (53d3736), held out on a
# model they were not read off: gpt3-xl (1.3B) at seq 2048 on one H100, every remat / offload /
# accumulation plan that fits (a spread of 8), unpaired (one process on a dedicated GPU).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
git log --oneline -1 >>$L 2>&1
stamp sweep gpt3-xl on one h100
timeout 400 python3 scripts/sweep_meshes.py --device h100 --devices 1 --every-knob --unpaired --model gpt3-xl --set vocab_size=50304 --batch-size 8 --seq-len 2048 --steps 3 --sample 8 --time-budget 300 --cache-dir /tmp/plancache --json $OUT/gpu_sweep_gpt3_xl.json --png $OUT/gpu_sweep_gpt3_xl.png >>$L 2>&1; stamp "rc=$?"
stamp end
