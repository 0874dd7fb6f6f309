"""Zero-bubble pipelines: ZB-H1 and ZB-V tick tables (B/W split, V placement, bubble, memory),
the split backward recomputing nothing (compiled FLOPs), one step's gradients against the
unpipelined step, loss curves against data parallelism with every mode, and bad input."""

from __future__ import annotations

import jax
import pytest

from colossal_jax.cli import main
from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig
from colossal_jax.pipeline.schedule import BACKWARD, FORWARD, WEIGHT, build, place
from colossal_jax.pipeline.timing import weigh
from tests.helpers import assert_pipelined_gradients_equal_plain

MODEL = {"n_layer": 8, "n_embd": 64, "n_head": 8, "block_size": 64}
TABLES = [(name, p, m) for name in ("zb-h1", "zb-v") for p, m in ((2, 4), (4, 8), (4, 4), (3, 7))]


def _v(name: str) -> int:
    return 2 if name == "zb-v" else 1


# ---- tick tables -------------------------------------------------------------------------------
@pytest.mark.parametrize("name,p,m", TABLES)
def test_every_f_b_w_runs_once_after_its_inputs_on_its_stage(name, p, m):
    v = _v(name)
    sched = build(name, p, m, v)
    when = {}
    for t, row in enumerate(sched.timeline):
        for s, op in enumerate(row):
            if op is not None:
                assert sched.stage_of(op.chunk) == s
                key = (op.kind, op.microbatch, op.chunk)
                assert key not in when
                when[key] = t
    last = p * v - 1
    for mb in range(m):
        for c in range(p * v):
            f, b, w = ((kind, mb, c) for kind in (FORWARD, BACKWARD, WEIGHT))
            if c > 0:
                assert when[(FORWARD, mb, c - 1)] < when[f]
            after = f if c == last else (BACKWARD, mb, c + 1)
            assert when[after] < when[b] < when[w]


def test_zb_v_places_chunks_s_and_2p_minus_1_minus_s_on_stage_s():
    p = 4
    sched = build("zb-v", p, 8, 2)
    for s in range(p):
        assert {sched.chunk_at(s, 0), sched.chunk_at(s, 1)} == {s, 2 * p - 1 - s}
    assert place(p - 1, p, 2, "v") == place(p, p, 2, "v")[:1] + (0,)  # the turn stays on p-1


@pytest.mark.parametrize("name,p,m", TABLES)
def test_the_bubble_is_p_minus_1_unit_ticks(name, p, m):
    """``(p−1)/(3·V·M+p−1)``: ZB-H1 a third of 1F1B's ``3(p−1)`` unit ticks, ZB-V a sixth."""
    v = _v(name)
    sched = build(name, p, m, v)
    assert sched.ticks == 3 * v * m + p - 1
    assert sched.idle_fraction() == pytest.approx((p - 1) / (3 * v * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
def test_memory_zb_h1_keeps_1f1b_residuals_and_zb_v_1f1b_peak(p, m):
    one_f_one_b = build("1f1b", p, m)
    h1 = build("zb-h1", p, m)
    assert h1.slots["residual"] == one_f_one_b.slots["residual"] == p
    # a microbatch lives from its F to its W: at most p on any stage, 1F1B's peak (stage 0)
    assert h1.slots["saved"] == max(h1.peak_alive) == max(one_f_one_b.peak_alive) == p
    assert h1.slots["wgrad"] <= p
    zbv = build("zb-v", p, m, 2)
    # half-stage chunks: 2p of them are 1F1B's p whole-stage microbatches
    assert max(zbv.peak_alive) <= 2 * p and zbv.slots["residual"] <= 2 * p


def test_cost_weighted_timing():
    sched = build("1f1b", 4, 8)
    unit = {b: 1.0 for b in sched.branches}
    timing = weigh(sched, unit)
    assert timing.idle_fraction == pytest.approx(sched.idle_fraction())
    assert timing.lockstep_time == sched.ticks
    fused = dict(unit, backward=2.0, backward_embed=2.0)
    timing = weigh(sched, fused)  # a backward tick costs a backward on every stage
    assert timing.step_time == 3 * (8 + 3)
    assert timing.lockstep_time > timing.step_time
    zb = build("zb-h1", 4, 8)
    split = weigh(zb, {b: 1.0 for b in zb.branches})
    assert split.idle_fraction < 0.45 * timing.idle_fraction
    with pytest.raises(ValueError, match="no cost"):
        weigh(zb, {"forward": 1.0})


# ---- numerics ---------------------------------------------------------------------------------
def _cfg(steps: int = 5, batch_size: int = 32, model=None, **parallel) -> TrainConfig:
    """As ``tests/test_pipeline.py``'s ``_cfg``: five steps (three of warm-up), no held-out
    evaluation (the curves compare training losses; it would compile the pipeline again)."""
    run = {k: parallel.pop(k) for k in ("grad_accum", "remat") if k in parallel}
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides=dict(model or MODEL),
        steps=steps,
        batch_size=batch_size,
        seq_len=32,
        devices=8,
        eval_every=0,
        optim=OptimConfig(lr=3e-3, warmup_steps=3),
        parallel=ParallelConfig(**parallel),
        **run,
    )


ZBV = dict(pipeline="zb-v", virtual_stages=2)
ONE_STEP = {
    "zb-h1-p2": dict(pipe=2, data=4, pipeline="zb-h1", microbatches=4),
    "zb-v-p4": dict(pipe=4, data=2, microbatches=4, **ZBV),
    "zb-h1-1d": dict(pipe=2, data=2, tensor_row=2, tensor_mode="1d", pipeline="zb-h1"),
    "zb-v-2d": dict(pipe=2, tensor_row=2, tensor_col=2, tensor_mode="2d", microbatches=4, **ZBV),
}


@pytest.mark.parametrize("name", list(ONE_STEP))
def test_one_step_gradients_equal_the_unpipelined_ones(name):
    assert_pipelined_gradients_equal_plain(_cfg(**ONE_STEP[name]))


def test_w_recomputes_nothing_compiled_flops_equal_1f1b_and_temporaries_at_most_1_1x():
    """The busiest device's compiled matmul FLOPs of ZB-H1 and ZB-V within 2% of 1F1B's (a W
    that re-ran the backward would add about a third), and their compiled temporaries at most
    1.1 × 1F1B's (a record holds the residuals, then the linears' inputs and output gradients:
    not both)."""
    from colossal_jax.analysis.compute import matmul_flops
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.checkpoint import abstract_like
    from colossal_jax.training.run import build as build_run
    from colossal_jax.training.steps import make_train_step

    def compiled(**parallel) -> tuple[float, int]:
        run = build_run(_cfg(pipe=2, data=4, microbatches=4, **parallel))
        params = abstract_like(run.abstract_params, run.param_shardings)
        opt = abstract_like(jax.eval_shape(run.tx.init, run.abstract_params), run.opt_shardings)
        step = make_train_step(run).lower(params, opt, global_batch(run, 0)).compile()
        text = step.as_text()
        sched = run.schedule
        n = len(sched.branches)
        flops = max(matmul_flops(text, {n: sched.branch_counts(s)}) for s in range(2))
        return flops, step.memory_analysis().temp_size_in_bytes

    base_flops, base_temp = compiled(pipeline="1f1b")
    for parallel in (dict(pipeline="zb-h1"), ZBV):
        flops, temp = compiled(**parallel)
        assert flops == pytest.approx(base_flops, rel=0.02), parallel
        assert temp <= 1.1 * base_temp, (parallel, temp, base_temp)


# ---- bad input --------------------------------------------------------------------------------
BAD = [  # (command line, what the one error line must name)
    ("--mesh pipe=2,data=4 --pipeline zb-v", "--virtual-stages 2"),
    ("--mesh pipe=2,data=4 --pipeline zb-v --virtual-stages 3", "--virtual-stages 2"),
    ("--mesh pipe=2,data=4 --pipeline zb-h1 --virtual-stages 2", "--virtual-stages 2"),
    ("--mesh pipe=4,data=2 --pipeline zb-h1 --microbatches 2", "--microbatches 2"),
    ("--mesh pipe=4,data=2 --pipeline zb-v --virtual-stages 2 --set model.n_layer=4", "n_layer=4"),
    ("--mesh data=8 --pipeline zb-h1", "pipe=N"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[b[0] for b in BAD])
def test_impossible_zero_bubble_pipelines_exit_2_before_compiling(
    argv, needle, capsys, monkeypatch
):
    import colossal_jax.training.loop as loop_module

    def no_compile(*a, **k):
        raise AssertionError("reached the compile step")

    monkeypatch.setattr(loop_module, "make_train_step", no_compile)
    assert main(["--devices", "8", "--steps", "2", *argv.split()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert needle in err[0], err[0]
