#!/bin/bash
# Eighth device call (one H200), after call 7's sweep stopped at the layer-memory compile (CPU arguments, GPU mesh): (1) the planner's step-time ranking and memory on a second GPU
# kind, with the code of this commit, every remat / offload / accumulation plan of gpt3-xl at
# seq 2048 that fits (a spread of 8), unpaired.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >>$L 2>&1
stamp sweep gpt3-xl on one h200
timeout 330 python3 scripts/sweep_meshes.py --device h200 --devices 1 --every-knob --unpaired --model gpt3-xl --set vocab_size=50304 --batch-size 8 --seq-len 2048 --steps 3 --sample 8 --time-budget 260 --cache-dir /tmp/plancache --json $OUT/gpu_sweep_gpt3_xl_h200.json --png $OUT/gpu_sweep_gpt3_xl_h200.png >>$L 2>&1; stamp "rc=$?"
stamp end
