"""Train from your own script: simulate 8 CPU devices, configure a short run, call ``train``.

python examples/train_from_python.py
"""

import colossal_jax as cj

cj.simulate_cpu_devices(8)  # before anything touches JAX; a no-op on a machine with 8 devices

cfg = cj.TrainConfig(
    model="gpt2-tiny",
    steps=40,
    batch_size=16,
    seq_len=64,
    eval_every=20,  # held-out loss before step 1, at step 20 and at the end
    parallel=cj.ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
)
result = cj.train(cfg, progress=False)

print("losses:", " ".join(f"{x:.3f}" for x in result.losses[::5]), f"... {result.final_loss:.3f}")
print("eval losses:", ", ".join(f"step {s}: {v:.4f}" for s, v in result.eval_losses))
print(f"final eval loss: {result.final_eval_loss:.4f}")
n_params = sum(x.size for x in __import__("jax").tree.leaves(result.params))
print(f"trained parameters: {n_params:,} on mesh {cfg.parallel.short()}")
