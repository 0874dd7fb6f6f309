"""Performance settings: the XLA flag preset, the step profiler and ``--remat dots``.

- ``--xla-preset gpu-perf`` adds its flags to ``XLA_FLAGS`` once, keeps a value the user set,
  and a run naming a preset whose flags are absent is refused (never silently without them).
- ``--profile-steps A:B`` traces exactly steps A..B (their step annotations) into the directory.
- ``--remat dots`` (the default: matmul outputs kept, element-wise ops recomputed) gives the
  loss and gradients of ``none`` (everything kept) through the scanned stack.
"""

from __future__ import annotations

import glob
import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from colossal_jax.config import ConfigError, TrainConfig, xla_presets
from colossal_jax.config.families import model_config
from colossal_jax.layers.stack import StackOptions, use_stack_options
from colossal_jax.parallel.remat import RematPolicy
from colossal_jax.runtime.profiling import StepProfiler
from colossal_jax_models.gpt import GPT


def test_gpu_perf_preset_adds_its_flags_once_and_keeps_the_users():
    env = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
        "--xla_gpu_enable_pipelined_all_reduce=false"
    }
    line = xla_presets.apply("gpu-perf", env)
    flags = env["XLA_FLAGS"].split()
    assert flags[0] == "--xla_force_host_platform_device_count=8"
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    assert "--xla_gpu_enable_pipelined_all_reduce=false" in flags  # the user's value stays
    assert "--xla_gpu_enable_pipelined_all_reduce=true" not in flags
    assert "kept the XLA_FLAGS values --xla_gpu_enable_pipelined_all_reduce=false" in line
    assert len(flags) == 1 + len(xla_presets.PRESETS["gpu-perf"])
    xla_presets.check_applied("gpu-perf", env)
    assert "(nothing new)" in xla_presets.apply("gpu-perf", env)
    assert env["XLA_FLAGS"].split() == flags
    with pytest.raises(ConfigError, match="--xla-preset gpu-perf is not in effect"):
        xla_presets.check_applied("gpu-perf", {"XLA_FLAGS": ""})


def test_profiler_traces_exactly_the_asked_steps(tmp_path):
    cfg = TrainConfig(profile_dir=str(tmp_path), profile_steps="2:3")
    profiler = StepProfiler.of(cfg)
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((8, 8))
    for step in range(1, 6):
        profiler.step(step, pending=x)
        x = f(x) / 8
    profiler.close(pending=x)
    (trace,) = glob.glob(f"{tmp_path}/**/perfetto_trace.json.gz", recursive=True)
    events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = {int(e["args"]["step_num"]) for e in events if e.get("name") == "train"}
    assert steps == {2, 3}


def test_dots_remat_gives_the_loss_and_gradients_of_none():
    cfg = model_config("gpt2-tiny", n_layer=2, n_embd=32, n_head=4, block_size=16)
    abstract = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0), unroll=False))  # a scan
    graphdef, shapes = nnx.split(abstract)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: 0.3 * rng.standard_normal(a.shape, np.float32), shapes)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 17)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))

    def value_and_grad(p, mode):
        def loss(p):
            with use_stack_options(StackOptions(remat=RematPolicy(mode).policy())):
                model = nnx.merge(graphdef, p)
                return model.loss(tokens[:, :-1], positions, tokens[:, 1:], jnp.ones((2, 16)))

        return jax.value_and_grad(loss)(p)

    both = jax.jit(lambda p: (value_and_grad(p, "none"), value_and_grad(p, "dots")))
    (loss_none, g_none), (loss_dots, g_dots) = both(params)
    assert float(loss_dots) == pytest.approx(float(loss_none), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g_dots), jax.tree.leaves(g_none), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_loop_order_with_and_without_host_overlap(monkeypatch):
    """``host_overlap=on``: the batch of step k+1 is built and step k+1 dispatched before step
    k's metrics are read (the last step is read at once); ``off`` (``auto`` on a CPU): each
    step is read before the next batch is built. The same losses either way, and the steps'
    times tile the loop."""
    import dataclasses

    import colossal_jax.training.loop as L
    from colossal_jax.training.trainer import train
    from tests.helpers import tiny_config

    events: list[str] = []
    build, get = L.global_batch, jax.device_get

    def batch(run, step):
        events.append(f"b{step}")
        return build(run, step)

    def read(tree):
        if isinstance(tree, dict) and "loss" in tree:
            events.append("r")
        return get(tree)

    monkeypatch.setattr(L, "global_batch", batch)
    monkeypatch.setattr(jax, "device_get", read)
    expected = {
        "on": ["b0", "b1", "b2", "r", "b3", "r", "r", "r"],
        "off": ["b0", "r", "b1", "r", "b2", "r", "b3", "r"],
    }
    losses = {}
    for setting, order in expected.items():
        events.clear()
        cfg = tiny_config(steps=4, devices=2)
        cfg = dataclasses.replace(cfg, eval_every=0, host_overlap=setting)
        summary = train(cfg, progress=False, log=lambda _: None)
        assert events[1:] == order, setting  # events[0]: the batch the step is compiled for
        assert len(summary.losses) == 4 and len(summary.step_times) == 4
        # the steps' times tile the loop up to its last read: every call and every wait for
        # results lies inside them, and nothing of the loop is counted twice
        inside = summary.loop_s - summary.host_s
        assert inside <= sum(summary.step_times) <= summary.loop_s, setting
        losses[setting] = summary.losses
    assert losses["on"] == losses["off"]


def test_host_overlap_setting():
    from colossal_jax.config.train_rules import host_overlap

    assert host_overlap("auto", "gpu") and host_overlap("auto", "tpu")
    assert not host_overlap("auto", "cpu")
    assert host_overlap("on", "cpu") and not host_overlap("off", "gpu")
    with pytest.raises(ConfigError, match="host_overlap 'sometimes' is not one of auto, on, off"):
        TrainConfig(host_overlap="sometimes").validate()
