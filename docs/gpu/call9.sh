#!/bin/bash
# Ninth device call (one H200, run inline on the machine call 8 left warm): the same check on
# gpt2-medium at seq 1024, every remat / offload / accumulation plan (a spread of 10), paired.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false; python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1; timeout 280 python3 scripts/sweep_meshes.py --device h200 --devices 1 --every-knob --model gpt2-medium --set vocab_size=50304 --batch-size 8 --seq-len 1024 --steps 5 --sample 10 --time-budget 220 --cache-dir /tmp/plancache --json $OUT/gpu_sweep_gpt2_medium_h200.json --png $OUT/gpu_sweep_gpt2_medium_h200.png 2>&1 | grep -v "plans:" | tee $OUT/log9.txt | tail -40
