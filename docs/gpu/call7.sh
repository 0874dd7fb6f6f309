#!/bin/bash
# Seventh device call (one H200): (1) the planner's step-time ranking and memory on a second GPU
# kind, with the code of this commit, every remat / offload / accumulation plan of gpt3-xl at
# seq 2048 that fits (a spread of 8), unpaired; (2) `--xla-preset gpu-perf` against no preset,
# the same gpt3-xl step, side by side in one call (performance.md: "not yet measured").
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >>$L 2>&1
stamp sweep gpt3-xl on one h200
timeout 230 python3 scripts/sweep_meshes.py --device h200 --devices 1 --every-knob --unpaired --model gpt3-xl --set vocab_size=50304 --batch-size 8 --seq-len 2048 --steps 3 --sample 8 --time-budget 180 --cache-dir /tmp/plancache --json $OUT/gpu_sweep_gpt3_xl_h200.json --png $OUT/gpu_sweep_gpt3_xl_h200.png >>$L 2>&1; stamp "rc=$?"
for p in none gpu-perf; do
stamp "gpt3-xl bench, preset $p"
if [ $p = none ]; then X=""; else X="--xla-preset gpu-perf"; fi
timeout 110 python3 scripts/bench_throughput.py --devices 1 --model gpt3-xl --set model.vocab_size=50304 --seq-len 2048 --batch-size 8 --precision bf16 $X --baseline none --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench_preset.json >>$L 2>&1; stamp "rc=$?"
done
stamp end
