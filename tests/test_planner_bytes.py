"""The planner's bytes per mesh axis against the compiled program's collectives: the sequence
kernels' traffic (grouped-query attention's narrower keys and values, the ring's extra
gradient hop, the grid modes' batch pieces) and the gradient's reduction over every replica
of the parameters (``data × seq``, by ZeRO stage)."""

from __future__ import annotations

import dataclasses

import pytest

from colossal_jax.auto import cost
from colossal_jax.auto.measure import compile_plan
from colossal_jax.auto.space import Knobs
from colossal_jax.checks.resolve import resolve
from colossal_jax.config.schema import ParallelConfig, TrainConfig
from tests.helpers import tiny_config

LLAMA = {"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "intermediate_size": 128}
"""Grouped-query attention: 4 query heads share 2 key/value heads."""
LAYERS = 4
"""A scanned stack of layers, as every planned model has (two unrolled layers let XLA cancel the
ring's last gradient hop against the next layer's at ``seq=2``)."""


def _gpt() -> TrainConfig:
    cfg = tiny_config(batch_size=16, seq_len=64)
    return dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, "n_layer": LAYERS})


def _plan(cfg: TrainConfig, zero: int = 0, accum: int = 1, **parallel):
    par = ParallelConfig(**{"data": 1, **parallel})
    knobs = Knobs(zero=zero, remat="none", offload="none", grad_accum=accum)
    return resolve(knobs.apply(dataclasses.replace(cfg, parallel=par)), 8)


def _predicted_bytes(plan) -> dict[str, float]:
    """The cost model's bytes per axis, as :func:`cost.predict` reports them (its
    ``axis_bytes``), without the memory model's per-family layer compiles."""
    return {axis: nbytes for axis, (nbytes, _) in cost.axis_traffic(plan).items()}


def _compare(plan) -> tuple[dict[str, float], dict[str, float]]:
    """``(predicted, compiled)`` bytes per device per step: ``seq`` alone and the total."""
    predicted = _predicted_bytes(plan)
    compiled = compile_plan(plan).axis_bytes
    return (
        {"seq": predicted.get("seq", 0.0), "total": sum(predicted.values())},
        {"seq": compiled.get("seq", 0.0), "total": sum(compiled.values())},
    )


EVERY_RUN = [
    ("ring-self-attention", {"data": 4, "seq": 2}, 0, 1),
    ("ulysses", {"data": 4, "seq": 2}, 2, 2),
]
"""Compiled in every run (the planner's tests stay within their CI minutes; the ring's own
bytes are checked in every run by the grouped-query test below); the rest of :data:`CASES`
with ``-m exhaustive``."""
CASES = [
    *EVERY_RUN,
    *(
        pytest.param(*case, marks=pytest.mark.exhaustive)
        for case in [
            ("ring", {"data": 4, "seq": 2}, 0, 1),
            ("ulysses", {"data": 2, "seq": 4}, 0, 1),
            ("ulysses", {"data": 4, "seq": 2}, 1, 1),
            ("ring", {"seq": 8}, 0, 1),
            ("ring", {"data": 2, "seq": 2, "tensor_depth": 2, "tensor_mode": "2.5d"}, 0, 1),
        ]
    ),
]


@pytest.mark.parametrize(("mode", "axes", "zero", "accum"), CASES)
def test_the_sequence_axis_and_the_gradient_reduction_are_predicted_as_compiled(
    mode, axes, zero, accum
):
    plan = _plan(_gpt(), zero, accum, seq_mode=mode, **axes)
    predicted, compiled = _compare(plan)
    assert predicted["seq"] == pytest.approx(compiled["seq"], rel=0.05)
    if "tensor_mode" not in axes:  # the grids' own traffic is another model's (docs/planner.md)
        assert predicted["total"] == pytest.approx(compiled["total"], rel=0.05)


@pytest.mark.parametrize("mode", ["ring", pytest.param("ulysses", marks=pytest.mark.exhaustive)])
def test_grouped_query_attention_moves_only_its_key_value_heads(mode):
    cfg = dataclasses.replace(_gpt(), model="llama-tiny", model_overrides=LLAMA)
    plan = _plan(cfg, data=4, seq=2, seq_mode=mode)
    predicted, compiled = _compare(plan)
    assert predicted["seq"] == pytest.approx(compiled["seq"], rel=0.05)
    # the same plan with every head its own key/value head moves more
    full = dataclasses.replace(cfg, model_overrides={**LLAMA, "n_kv_head": 4})
    assert _predicted_bytes(_plan(full, data=4, seq=2, seq_mode=mode))["seq"] > predicted["seq"]


REMAT_EVERY_RUN = [
    ({"data": 4, "tensor_row": 2, "tensor_mode": "1d"}, "dots"),
    ({"data": 4, "seq": 2, "seq_mode": "ulysses"}, "dots"),
]
"""Compiled in every run: 1D's re-issued all-reduce and Ulysses' all-to-alls; the grids and the
ring's policies with ``-m exhaustive``."""
REMAT_CASES = [
    *REMAT_EVERY_RUN,
    *(
        pytest.param(*case, marks=pytest.mark.exhaustive)
        for case in [
            ({"tensor_row": 8, "tensor_mode": "1d"}, "full"),
            ({"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d"}, "dots"),
            ({"tensor_row": 2, "tensor_col": 2, "tensor_depth": 2, "tensor_mode": "3d"}, "dots"),
            ({"data": 4, "seq": 2, "seq_mode": "ring-self-attention"}, "selective"),
            ({"data": 2, "seq": 4, "seq_mode": "ring"}, "full"),
            ({"data": 2, "seq": 4, "seq_mode": "ring"}, "dots"),
        ]
    ),
]


def _with_remat(plan, remat: str):
    knobs = Knobs(zero=plan.zero, remat=remat, offload="none", grad_accum=plan.grad_accum)
    return resolve(knobs.apply(plan.config), 8)


@pytest.mark.parametrize(("axes", "remat"), REMAT_CASES)
def test_a_remat_policy_sends_the_recomputed_forward_again(axes, remat):
    """The bytes a policy adds to ``none``'s, per axis, predicted as compiled (within 10%): the
    recomputed forward's collectives (1D's attention-output all-reduce, the grids' gathers,
    Ulysses' all-to-alls, ring self-attention's rotations, the ring's hops under ``full``)."""
    cfg = dataclasses.replace(_gpt(), model_overrides={**_gpt().model_overrides, "n_head": 8})
    base = _plan(cfg, **axes)
    plan = _with_remat(base, remat)
    added_pred = sum(_predicted_bytes(plan).values()) - sum(_predicted_bytes(base).values())
    added = sum(compile_plan(plan).axis_bytes.values()) - sum(
        compile_plan(base).axis_bytes.values()
    )
    assert added_pred == pytest.approx(added, rel=0.10, abs=1024)
    if axes.get("seq_mode") == "ring" and remat == "dots":  # the kernel saves its residuals
        assert added_pred == 0.0
    else:
        assert added_pred > 0.0


PIPELINED_EVERY_RUN = [
    ({"pipe": 2, "seq": 4, "seq_mode": "ring", "pipeline": "1f1b", "microbatches": 4}, 0),
    ({"pipe": 2, "data": 4, "pipeline": "gpipe", "microbatches": 4}, 3),
]
"""Compiled in every run: a stage's ring hops as all-to-alls (``p − 1`` blocks each) with
1F1B's message count, and ZeRO-3's gathers in a pipeline; the rest with ``-m exhaustive``."""
PIPELINED_CASES = [
    *PIPELINED_EVERY_RUN,
    *(
        pytest.param(*case, marks=pytest.mark.exhaustive)
        for case in [
            (
                {
                    "pipe": 2,
                    "seq": 4,
                    "seq_mode": "ring-self-attention",
                    "pipeline": "gpipe",
                    "microbatches": 4,
                },
                0,
            ),
            ({"pipe": 4, "data": 2, "pipeline": "1f1b", "microbatches": 8}, 1),
            ({"pipe": 2, "data": 4, "pipeline": "zb-h1", "microbatches": 4}, 2),
            (
                {
                    "pipe": 2,
                    "data": 4,
                    "pipeline": "interleaved",
                    "microbatches": 4,
                    "virtual_stages": 2,
                },
                3,
            ),
        ]
    ),
]


@pytest.mark.parametrize(("axes", "zero"), PIPELINED_CASES)
def test_a_pipelines_bytes_per_axis_are_predicted_as_compiled(axes, zero):
    """``pipe`` (the schedule's messages, the rest of the parameters gathered and their
    gradient scattered back), ``seq`` (a stage's hops as all-to-alls) and ``data`` (ZeRO) of a
    pipelined plan, each within 5% of the compiled program's (a collective over several axes,
    e.g. ``data+pipe``, counted on the first)."""
    plan = _plan(_gpt(), zero, **axes)
    predicted = _predicted_bytes(plan)
    compiled: dict[str, float] = {}
    for key, nbytes in compile_plan(plan).axis_bytes.items():
        compiled[key.split("+")[0]] = compiled.get(key.split("+")[0], 0.0) + nbytes
    for axis in ("pipe", "seq", "data"):
        assert predicted.get(axis, 0.0) == pytest.approx(compiled.get(axis, 0.0), rel=0.05), axis


@pytest.mark.parametrize("zero", [2, pytest.param(1, marks=pytest.mark.exhaustive)])
def test_zero_runs_an_all_gather_and_a_reduce_scatter_per_parameter_leaf(zero):
    """XLA combines the gradient's all-reduces into a few but runs ZeRO's all-gathers and
    reduce-scatters one per parameter leaf: the predicted count of ``data``'s collectives (its
    α) is the compiled one."""
    import jax

    from colossal_jax.analysis.axes import group_axes
    from colossal_jax.analysis.compile_only import ANALYSIS_ONLY
    from colossal_jax.analysis.hlo import collective_lines, device_groups
    from colossal_jax.config.choices import MESH_ORDER
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.checkpoint import abstract_like
    from colossal_jax.training.run import build
    from colossal_jax.training.steps import make_train_step

    plan = _plan(_gpt(), zero, data=8)
    run = build(plan)
    params = abstract_like(run.abstract_params, run.param_shardings)
    opt = abstract_like(jax.eval_shape(run.tx.init, run.abstract_params), run.opt_shardings)
    lowered = make_train_step(run).lower(params, opt, global_batch(run, 0))
    text = lowered.compile(compiler_options=ANALYSIS_ONLY).as_text()
    compiled = 0.0
    for collective, line in collective_lines(text):
        axes, _ = group_axes(device_groups(line, 8), tuple(plan.mesh_shape), tuple(MESH_ORDER))
        if axes == ("data",) and collective.total_bytes > 0:
            compiled += collective.count
    assert cost.axis_traffic(plan)["data"][1] == compiled
