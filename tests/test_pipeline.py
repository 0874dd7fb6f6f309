"""Pipeline parallelism: tick tables (bubble, memory, order), one step's gradients against the
unpipelined step, loss curves against data parallelism, composition with every mode, bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from colossal_jax.cli import main
from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig
from colossal_jax.pipeline.schedule import BACKWARD, FORWARD, build
from tests.helpers import assert_pipelined_gradients_equal_plain, losses

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"n_layer": 8, "n_embd": 64, "n_head": 8, "block_size": 64}
GRID = [
    (name, p, m, v)
    for p in (2, 4)
    for m in (4, 8)
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))
]


# ---- tick tables -------------------------------------------------------------------------------
@pytest.mark.parametrize("name,p,m,v", GRID + [("interleaved", 2, 8, 4), ("1f1b", 4, 16, 1)])
def test_idle_fraction_of_the_table_is_the_formula(name, p, m, v):
    sched = build(name, p, m, v)
    assert sched.idle_fraction() == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert sched.ticks == 2 * (v * m + p - 1)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4), (8, 16)])
def test_1f1b_keeps_at_most_p_minus_stage_microbatches_alive(p, m):
    assert build("1f1b", p, m).peak_alive == [p - s for s in range(p)]
    assert build("gpipe", p, m).peak_alive == [m] * p


@pytest.mark.parametrize("name,p,m,v", GRID)
def test_every_operation_runs_once_after_its_inputs(name, p, m, v):
    sched = build(name, p, m, v)
    when = {}
    for t, row in enumerate(sched.timeline):
        for s, op in enumerate(row):
            if op is not None:
                assert op.chunk % p == s, "chunk c runs on stage c mod p"
                key = (op.kind, op.microbatch, op.chunk)
                assert key not in when
                when[key] = t
    last = p * v - 1
    for mb in range(m):
        for c in range(p * v):
            assert (FORWARD, mb, c) in when and (BACKWARD, mb, c) in when
            if c > 0:
                assert when[(FORWARD, mb, c - 1)] < when[(FORWARD, mb, c)]
            after = (FORWARD, mb, c) if c == last else (BACKWARD, mb, c + 1)
            assert when[after] < when[(BACKWARD, mb, c)]


# ---- numerics ---------------------------------------------------------------------------------
STEPS = 5
"""The loss curves' length: three warm-up steps and two after (a step runs for 1–1.5 s at
``pipe=4`` on two CPU cores; the one-step gradients are compared exactly apart)."""


def _cfg(steps: int = STEPS, batch_size: int = 32, **parallel) -> TrainConfig:
    """The curves' run without held-out evaluation: the tests compare training losses only, and
    the evaluation would compile the pipelined loss a second time (a pipelined run's evaluation
    is tested in ``tests/test_api.py::test_pipelined_run_evaluates`` and, chunk-ordered,
    against ``data=8``'s in ``tests/test_checkpoint.py``)."""
    par = ParallelConfig(**parallel)
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides=dict(MODEL),
        steps=steps,
        batch_size=batch_size,
        seq_len=32,
        devices=8,
        eval_every=0,
        optim=OptimConfig(lr=3e-3, warmup_steps=3),
        parallel=par,
    )


@pytest.fixture(scope="module")
def data_parallel_losses():
    return losses(_cfg(data=8))


@pytest.mark.parametrize(
    "parallel",
    [
        dict(pipe=2, data=4, pipeline="1f1b", microbatches=4),
        dict(pipe=4, data=2, pipeline="gpipe", microbatches=8),
        dict(
            pipe=2,
            data=2,
            tensor_row=2,
            tensor_mode="1d",
            pipeline="interleaved",
            microbatches=4,
            virtual_stages=2,
        ),
    ],
    ids=["1f1b-p2", "gpipe-p4", "interleaved-1d"],
)
def test_one_step_gradients_equal_the_unpipelined_ones(parallel):
    assert_pipelined_gradients_equal_plain(_cfg(**parallel))


@pytest.mark.parametrize("pipeline", ["1f1b", "zb-h1"])
def test_parameter_only_residuals_are_recomputed_not_stored(pipeline):
    """Under ``remat=none`` with a tensor and a sequence split, the chunk's residuals that are
    functions of its weights alone (made varying over the split axes) are recomputed from the
    stack in the backward, not stored per microbatch; the gradients stay the unpipelined ones."""
    import dataclasses

    from colossal_jax.pipeline import executor

    par = dict(pipe=2, tensor_row=2, tensor_mode="1d", seq=2, seq_mode="ring", microbatches=4)
    cfg = dataclasses.replace(_cfg(pipeline=pipeline, **par), remat="none")
    seen = []
    init = executor._StageProgram.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(sum(1 for k in self._res_tree[1] if k is not None and k[0] == "derived"))

    executor._StageProgram.__init__ = spy
    try:
        assert_pipelined_gradients_equal_plain(cfg)
    finally:
        executor._StageProgram.__init__ = init
    assert seen and min(seen) > 0, seen


def test_param_only_marks_and_recomputes_what_depends_on_the_parameters_alone():
    import jax.numpy as jnp

    from colossal_jax.pipeline.residuals import ParamOnly

    outside = jnp.arange(2.0)

    def fn(params, x):
        w, b = params["w"], params["b"]
        return [w.T, x @ w, jnp.cos(b) * 2, b + outside, w]

    params = {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.ones(2)}
    only = ParamOnly(fn, params, jnp.ones((4, 3)))
    assert only.mask == [True, False, True, False, True]
    got = only.recompute(params)
    want = [params["w"].T, jnp.cos(params["b"]) * 2, params["w"]]
    assert len(got) == 3 and all(jnp.allclose(g, w) for g, w in zip(got, want, strict=True))


# every schedule at both depths with m = 8 (m = 4 is covered by the one-step gradient test
# above); the default run keeps 1F1B at p = 4, the others run with -m exhaustive (every
# schedule's one-step gradients are checked in the default run, and the zero-bubble curves in
# tests/test_zero_bubble_curves.py)
CURVES = [
    pytest.param(
        *g,
        id=f"{g[0]}-p{g[1]}-m{g[2]}",
        marks=[pytest.mark.exhaustive] * (g[1] == 2 or g[0] != "1f1b"),
    )
    for g in GRID
    if g[2] == 8
]


@pytest.mark.slow
@pytest.mark.parametrize("name,p,m,v", CURVES)
def test_every_schedule_gives_the_data_parallel_loss_curve(name, p, m, v, data_parallel_losses):
    got = losses(_cfg(pipe=p, data=8 // p, pipeline=name, microbatches=m, virtual_stages=v))
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)


# ---- bad input --------------------------------------------------------------------------------
BAD = [  # (command line, what the one error line must name)
    ("--mesh pipe=4,data=2 --set model.n_layer=6", "n_layer=6"),
    (
        "--mesh pipe=2,data=4 --pipeline interleaved --virtual-stages 2 --set model.n_layer=6",
        "virtual_stages=2",
    ),
    ("--mesh pipe=4,data=2 --microbatches 2", "--microbatches 2"),
    (
        "--mesh pipe=2,data=4 --pipeline interleaved --virtual-stages 2 --microbatches 5 "
        "--set model.n_layer=4",
        "--microbatches 5",
    ),
    ("--mesh pipe=2,data=4 --microbatches 4 --batch-size 8", "--batch-size 8"),
    ("--mesh pipe=2,data=4 --virtual-stages 2", "--virtual-stages 2"),
    ("--mesh pipe=2,data=4 --pipeline interleaved", "--virtual-stages"),
    ("--mesh data=8 --pipeline 1f1b", "pipe=N"),
    ("--mesh pipe=2,data=4 --pipeline zigzag", "--pipeline"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[b[1] for b in BAD])
def test_impossible_pipelines_exit_2_before_compiling(argv, needle, capsys, monkeypatch):
    import colossal_jax.training.loop as loop_module

    def no_compile(*a, **k):
        raise AssertionError("reached the compile step")

    monkeypatch.setattr(loop_module, "make_train_step", no_compile)
    assert main(["--devices", "8", "--steps", "2", *argv.split()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert needle in err[0], err[0]


def test_stacked_parameters_split_their_layer_axis_over_pipe_and_the_rest_splits_too():
    """The stack's layer axis is split over ``pipe``; the embedding, final norm and head are
    stored split over ``pipe`` along another dimension (each stage keeps half at ``pipe=2``)."""
    from colossal_jax.training.run import build as build_run

    run = build_run(_cfg(pipe=2, data=4, pipeline="1f1b"))
    specs = {
        "/".join(map(str, path)): sh.spec
        for path, sh in jax.tree_util.tree_flatten_with_path(run.param_shardings)[0]
    }
    stacked = [k for k in specs if "blocks" in k]
    assert stacked and all(specs[k][0] == "pipe" for k in stacked)
    rest = [k for k in specs if "blocks" not in k]
    assert rest and all("pipe" in specs[k] for k in rest), {k: specs[k] for k in rest}
    flat = dataclasses.replace(run.cfg, parallel=ParallelConfig(data=8))
    flat_run = build_run(flat)
    flat_specs = jax.tree.leaves(flat_run.param_shardings, is_leaf=lambda x: hasattr(x, "spec"))
    assert all("pipe" not in tuple(s.spec) for s in flat_specs)


def test_a_pipe_axis_defaults_to_1f1b_from_python_too():
    assert ParallelConfig(pipe=2, data=4).pipeline == "1f1b"
    assert ParallelConfig(data=8).pipeline == "none"


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_the_tick_loop_updates_its_slots_in_place(name):
    """The tick loop copies (almost) nothing of its carry per tick: a tick's branch once took and
    returned the whole carry, and XLA copied every slot buffer at every tick (then 42 of 46 MiB
    per tick for GPipe at p = 4, M = 8 on a 4-layer, 256-wide GPT)."""
    from colossal_jax.analysis.compute import while_loops
    from colossal_jax.auto.measure import Stepper
    from colossal_jax.checks.resolve import resolve
    from colossal_jax.runtime.devices import current_devices

    cfg = _cfg(pipe=4, data=2, pipeline=name, microbatches=8)
    stepper = Stepper(resolve(cfg, current_devices()), allocate=False)
    ticks = build(name, 4, 8).ticks
    (loop,) = [lp for lp in while_loops(stepper.step.as_text()) if lp.trip_count == ticks]
    assert loop.copied_bytes < 0.25 * loop.carry_bytes, (loop.copied_bytes, loop.carry_bytes)


@pytest.mark.parametrize(
    "name,p,m,v",
    [("gpipe", 4, 8, 1), ("1f1b", 2, 4, 1), ("interleaved", 4, 8, 2), ("zb-v", 4, 8, 2)],
)
def test_the_rings_column_names_the_rings_that_carry_a_message(name, p, m, v):
    from colossal_jax.pipeline.schedule import COL, RINGS_BOTH, SEND_DOWN, SEND_UP

    sched = build(name, p, m, v)
    rings = sched.table[:, :, COL["rings"]]
    assert (rings == rings[:, :1]).all()  # the same on every stage of a tick
    sends = sched.table[:, :, COL["send"]]
    up, down = (sends == SEND_UP).any(axis=1), (sends == SEND_DOWN).any(axis=1)
    assert (rings[:, 0] == up + 2 * down).all()
    counts = sched.ring_counts()
    assert sum(counts) == sched.ticks and len(counts) == RINGS_BOTH + 1
    assert counts[0] + counts[2] > 0  # some ticks leave the up ring idle


def test_messages_move_only_on_the_ticks_that_carry_one():
    """The compiled step's pipe traffic, each branch of the message switch counted on the ticks
    the table runs it, is one microbatch's activation per message the table sends (GPipe at
    p = 2, where both phases use one ring: half the ticks of the old every-tick ppermutes)."""
    from colossal_jax.analysis.axes import axis_bytes
    from colossal_jax.auto.measure import Stepper
    from colossal_jax.checks.resolve import resolve
    from colossal_jax.config.choices import MESH_ORDER
    from colossal_jax.pipeline.schedule import COL, NO_SEND, SEND_SELF
    from colossal_jax.runtime.devices import current_devices

    cfg = _cfg(pipe=2, data=4, pipeline="gpipe", microbatches=4)
    plan = resolve(cfg, current_devices())
    text = Stepper(plan, allocate=False).step.as_text()
    sched = build("gpipe", 2, 4)
    shape = tuple(plan.mesh_shape)
    rings = sched.ring_counts()

    def pipe_bytes(counts: list[int]) -> float:  # the ends' gathers over pipe included
        return axis_bytes(text, shape, tuple(MESH_ORDER), {len(counts): counts})["pipe"]

    none, weighted, every_tick = (
        pipe_bytes([1, 0, 0, 0]),
        pipe_bytes(rings),
        pipe_bytes([0, 0, 0, 1]),
    )
    sends = sched.table[:, :, COL["send"]]
    messages = int(((sends != NO_SEND) & (sends != SEND_SELF)).any(axis=1).sum())
    assert 0 < messages < sched.ticks
    expected = (every_tick - none) * messages / (2 * sched.ticks)
    assert weighted - none == pytest.approx(expected, rel=1e-6)


def test_a_sequence_split_reduces_the_gradient_once_not_per_microbatch():
    """Under ``seq`` the parameters enter the pipeline varying over it, so no tick's ``vjp``
    all-reduces its chunk's gradient there: the compiled step moves the same bytes on ``seq``
    at 2 and 4 microbatches (per microbatch the reduction would add the stage's gradient each
    time). Its loss curve is the data-parallel one (``test_modes_compose_inside_a_stage``).
    One layer per stage compiles fastest; its gradient (about 0.2 MB a microbatch) is still
    hundreds of times the 1e-3 the comparison allows of the 0.5 MB the ring moves."""
    from colossal_jax.auto.measure import compile_plan
    from colossal_jax.checks.resolve import resolve
    from colossal_jax.runtime.devices import current_devices

    parallel = dict(pipe=2, seq=2, data=2, seq_mode="ring", pipeline="1f1b")

    def cfg(m: int) -> TrainConfig:
        two_layers = dict(MODEL, n_layer=2)
        return dataclasses.replace(_cfg(**parallel, microbatches=m), model_overrides=two_layers)

    moved = [compile_plan(resolve(cfg(m), current_devices())).axis_bytes for m in (2, 4)]
    assert moved[0]["seq"] == pytest.approx(moved[1]["seq"], rel=1e-3)
