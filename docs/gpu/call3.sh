#!/bin/bash
# Third device call: the planner's single-GPU predictions against measurement (every remat /
# offload / accumulation plan of gpt2-medium), then gpt2-medium beside torch.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
python3 -c "import jax; print(jax.__version__, jax.devices())" >>$L 2>&1
stamp sweep gpt2-medium on one h100
timeout 300 python3 scripts/sweep_meshes.py --device h100 --devices 1 --every-knob --model gpt2-medium --set vocab_size=50304 --batch-size 8 --seq-len 1024 --steps 5 --sample 10 --time-budget 210 --cache-dir /tmp/plancache --json $OUT/gpu_sweep_gpt2_medium.json --png $OUT/gpu_sweep_gpt2_medium.png >>$L 2>&1; stamp "rc=$?"
stamp gpt2-medium bench vs torch
timeout 150 python3 scripts/bench_throughput.py --devices 1 --model gpt2-medium --set model.vocab_size=50304 --seq-len 1024 --batch-size 8 --precision bf16 --xla-preset gpu-perf --baseline torch --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench.json >>$L 2>&1; stamp "rc=$?"
stamp end
