#!/bin/bash
# Second device call: the float32 embedding gradient, measured beside torch again; the GPU kernels' profile.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
stamp gpt2-small profile
timeout 60 python3 scripts/train.py --devices 1 --model gpt2-small --set model.vocab_size=50304 --seq-len 1024 --batch-size 16 --precision bf16 --steps 8 --eval-every 0 --no-progress --profile-dir /tmp/prof --profile-steps 5:6 --metrics-file $OUT/gpt2s_metrics.jsonl >>$L 2>&1 || { stamp "profile run failed rc=$?"; exit 3; }
python3 .gpu/trace_top.py /tmp/prof > $OUT/trace_top.txt 2>&1
stamp gpt2-small bench vs torch
timeout 110 python3 scripts/bench_throughput.py --devices 1 --model gpt2-small --set model.vocab_size=50304 --seq-len 1024 --batch-size 16 --precision bf16 --xla-preset gpu-perf --baseline torch --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench.json >>$L 2>&1; stamp "rc=$?"
stamp gpt3-xl bench vs torch
timeout 200 python3 scripts/bench_throughput.py --devices 1 --model gpt3-xl --set model.vocab_size=50304 --seq-len 2048 --batch-size 8 --precision bf16 --xla-preset gpu-perf --baseline torch --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench.json >>$L 2>&1; stamp "rc=$?"
stamp end
