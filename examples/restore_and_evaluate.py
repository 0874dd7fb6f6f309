"""Train a few steps with checkpoints, then restore the checkpoint and evaluate it on held-out data.

    python examples/restore_and_evaluate.py

The restore target is built from the configuration alone (``cj.build``); the checkpoint is
placed in the shardings of that run, here on a different mesh from the one that saved it.
"""

import dataclasses
import tempfile

import colossal_jax as cj

cj.simulate_cpu_devices(8)

with tempfile.TemporaryDirectory() as ckpt_dir:
    cfg = cj.TrainConfig(
        steps=20,
        batch_size=16,
        seq_len=64,
        eval_every=20,
        checkpoint_dir=ckpt_dir,
        checkpoint_every=10,
        parallel=cj.ParallelConfig(data=8),
    )
    trained = cj.train(cfg, progress=False)
    print(f"trained: step {trained.final_step}, eval loss {trained.final_eval_loss:.4f}")

    # a fresh process would do only this: build the run and restore the latest checkpoint
    other_mesh = cj.ParallelConfig(data=2, tensor_row=4, tensor_mode="1d")
    run = cj.build(dataclasses.replace(cfg, parallel=other_mesh))
    params, opt_state, step = cj.restore(run, ckpt_dir)
    print(f"restored step {step} onto mesh {other_mesh.short()}")

    untrained = cj.evaluate(run, cj.init_state(run)[0])
    restored = cj.evaluate(run, params)
    print(f"eval loss of a fresh (untrained) model: {untrained:.4f}")
    print(f"eval loss of the restored model: {restored:.4f}")

    # the restored parameters are an nnx.State: merge them into a model to use it directly
    from flax import nnx

    model = nnx.merge(run.graphdef, params)
    print(f"model: {type(model).__name__} with {model.cfg.n_layer} layers")
