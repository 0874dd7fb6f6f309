#!/bin/bash
# One device call: the GPU figures of docs/performance.md, in order of priority, each bounded.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
L=$OUT/log.txt
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a $L; }
stamp setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>$L 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >>$L 2>&1 || stamp "pip install failed"
python3 -c "import jax, flax, optax, torch; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__)" >>$L 2>&1
stamp smoke
timeout 90 python3 scripts/train.py --devices 1 --model gpt2-tiny --steps 3 --eval-every 0 --precision bf16 --no-progress >>$L 2>&1 || { stamp "smoke failed rc=$?"; exit 3; }
stamp gpt3-xl bench vs torch
timeout 230 python3 scripts/bench_throughput.py --devices 1 --model gpt3-xl --set model.vocab_size=50304 --seq-len 2048 --batch-size 8 --precision bf16 --xla-preset gpu-perf --baseline torch --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench.json >>$L 2>&1; stamp "rc=$?"
stamp gpt2-small profile
timeout 75 python3 scripts/train.py --devices 1 --model gpt2-small --set model.vocab_size=50304 --seq-len 1024 --batch-size 16 --precision bf16 --steps 8 --eval-every 0 --no-progress --profile-dir /tmp/prof --profile-steps 5:6 --metrics-file $OUT/gpt2s_metrics.jsonl >>$L 2>&1; stamp "rc=$?"
python3 .gpu/trace_top.py /tmp/prof > $OUT/trace_top.txt 2>&1
stamp offload none/optimizer gpt2-medium
for o in none optimizer; do
timeout 60 python3 scripts/train.py --devices 1 --model gpt2-medium --set model.vocab_size=50304 --seq-len 1024 --batch-size 8 --precision bf16 --steps 4 --eval-every 0 --no-progress --offload $o --metrics-file $OUT/offload_$o.jsonl >>$L 2>&1; stamp "offload $o rc=$?"
done
stamp gpt2-small bench vs torch
timeout 90 python3 scripts/bench_throughput.py --devices 1 --model gpt2-small --set model.vocab_size=50304 --seq-len 1024 --batch-size 16 --precision bf16 --xla-preset gpu-perf --baseline torch --steps 10 --timed-steps 10 --bench-warmup 2 --loop-repeats 1 --json $OUT/gpu_bench.json >>$L 2>&1; stamp "rc=$?"
stamp end
