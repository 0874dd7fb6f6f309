"""One model, several meshes, a short run each: a table of loss, tokens/s and compile time.

    python examples/compare_meshes.py

Every mesh trains the same model from the same seed on the same batches, so the losses agree
closely (up to float rounding); the speed and compile time show what each layout costs here (on
simulated CPU devices: the relative numbers say little about a GPU).
"""

import colossal_jax as cj

cj.simulate_cpu_devices(8)

MESHES = {
    "data=8": cj.ParallelConfig(data=8),
    "tensor=8 (1d)": cj.ParallelConfig(tensor_row=8, tensor_mode="1d"),
    "data=2,tensor=4 (2d)": cj.ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "pipe=2,data=4 (1f1b)": cj.ParallelConfig(pipe=2, data=4, pipeline="1f1b", microbatches=2),
}

rows = []
for name, parallel in MESHES.items():
    cfg = cj.TrainConfig(
        steps=6,
        batch_size=8,
        seq_len=32,
        eval_every=0,
        model_overrides={"n_layer": 4},
        parallel=parallel,
    )
    result = cj.train(cfg, progress=False, log=lambda _: None)
    rows.append((name, result.final_loss, result.tokens_per_s, result.compile_s))
    print(f"ran {name}", flush=True)

print()
print(f"{'mesh':24s} {'final loss':>10s} {'tokens/s':>10s} {'compile s':>9s}")
for name, loss, tps, compile_s in rows:
    print(f"{name:24s} {loss:10.4f} {tps:10,.0f} {compile_s:9.1f}")
