#!/bin/bash
# Sixth device call: compiled memory only (nothing runs, nothing allocated) of every remat /
# offload / accumulation plan of gpt3-xl at seq 2048 on one H100, for the GPU memory model.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
stamp compile-only sweep gpt3-xl
timeout 170 python3 scripts/sweep_meshes.py --device h100 --devices 1 --every-knob --unpaired --model gpt3-xl --set vocab_size=50304 --batch-size 8 --seq-len 2048 --steps 0 --sample 24 --time-budget 150 --cache-dir /tmp/plancache --json $OUT/gpu_compiled_gpt3_xl.json >>$L 2>&1; stamp "rc=$?"
stamp end
