"""The planner's per-family activation memory (auto/layer_memory.py: kept residuals traced,
the backward's working set compiled once), the grid modes' gathered inputs, and the simulated
CPU devices' step costs (cost.cpu_terms) with their fit to a sweep (auto/fit_cpu.py).
docs/planner.md."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from colossal_jax.auto import (
    cost,
    fit_cpu,
    hardware,
    layer_memory,
    memory,
    memory_weights,
    policy_memory,
    whole_share,
)
from colossal_jax.auto.per_device import pipeline_shape, stack_params
from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ParallelConfig, TrainConfig
from colossal_jax.config.families import model_config
from colossal_jax.config.plan import Devices
from colossal_jax.pipeline.schedule import build

SMALL = {"n_layer": 2, "n_embd": 64, "n_head": 4}


def _plan(
    platform: str = "cpu",
    remat: str = "none",
    layers: int = 2,
    model: dict | None = None,
    seq_len: int = 32,
    **par,
) -> object:
    """A plan of the GPT (``SMALL`` with ``layers`` layers, or ``model``'s overrides) at batch
    16 × ``seq_len`` on 8 devices of ``platform``."""
    cfg = TrainConfig(
        model="gpt2-tiny",
        model_overrides=model if model is not None else {**SMALL, "n_layer": layers},
        batch_size=16,
        seq_len=seq_len,
        devices=8,
        precision="fp32",
        remat=remat,
        parallel=ParallelConfig(**par),
    )
    return resolve(cfg, Devices(count=8, platform=platform))


def _compiled_kept_per_token(model, seq: int) -> float:
    """What XLA stores per layer and token in the compiled stack: the temporaries of the
    stack's gradient at one layer more, less them at one fewer."""
    temps = {}
    for layers in (layer_memory.STACK, layer_memory.STACK + 1):
        f, params = layer_memory.stack_fn(model, layers, "none")
        x = jax.ShapeDtypeStruct((2, seq, model.n_embd), jnp.float32)
        pos = jax.ShapeDtypeStruct((2, seq), jnp.int32)
        compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(params, x, pos).compile()
        temps[layers] = compiled.memory_analysis().temp_size_in_bytes / 4
    return (temps[layer_memory.STACK + 1] - temps[layer_memory.STACK]) / (2 * seq)


def test_traced_residuals_are_what_the_compiled_stack_keeps():
    model = model_config("gpt2-tiny", **SMALL)
    seq = 32
    k = layer_memory.kept(model, "none")
    assert k.scores == pytest.approx(2.0)  # the scores and their probabilities
    traced = k.other + k.scores * model.n_head * seq
    assert traced == pytest.approx(_compiled_kept_per_token(model, seq), rel=0.05)


def test_policies_keep_less_in_order_and_offload_nothing():
    model = model_config("gpt2-tiny", **SMALL)
    kept = {r: layer_memory.kept(model, r) for r in ("none", "dots", "selective", "full")}
    assert kept["none"].other > kept["dots"].other > kept["selective"].other > kept["full"].other
    assert (kept["dots"].scores, kept["selective"].scores, kept["full"].scores) == (1, 0, 0)
    assert kept["full"].other == model.n_embd  # the layer's input alone
    assert memory.kept_elements(_plan(remat="offload", data=8)) == 0.0


def test_working_set_is_compiled_once_then_read_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("COLOSSAL_JAX_CACHE", str(tmp_path))
    model = model_config("gpt2-tiny", **{**SMALL, "n_embd": 96})  # a size nothing else uses
    layer_memory.working.cache_clear()
    first = layer_memory.working(model, 32)
    assert first.other >= 0 and first.scores >= 0 and first.fixed > 0
    assert list((tmp_path / "layer").glob("*.json"))
    layer_memory.working.cache_clear()

    def no_compile(*_a, **_k):
        raise AssertionError("compiled again instead of reading the cache")

    monkeypatch.setattr(layer_memory, "_temp_elements", no_compile)
    assert layer_memory.working(model, 32) == first


def test_the_policy_working_set_is_compiled_once_per_policy_then_read_from_disk(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("COLOSSAL_JAX_CACHE", str(tmp_path))
    model = model_config("llama-tiny", n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
    policy_memory.policy_working.cache_clear()
    seen = []
    compile_temps = policy_memory._step_temp_elements

    def spy(model, batch, seq, remat):
        seen.append((batch, seq, remat))
        return compile_temps(model, batch, seq, remat)

    monkeypatch.setattr(policy_memory, "_step_temp_elements", spy)
    full = policy_memory.policy_working(model, 32, "full")
    shapes = [(b, 32 // d) for b, d in policy_memory.POLICY_SHAPES]
    assert sorted(set(seen)) == sorted({(b, s, r) for b, s in shapes for r in ("full", "none")})
    assert min(full.other, full.scores, full.fixed) >= 0
    zero = layer_memory.Working(0.0, 0.0, 0.0)
    assert policy_memory.policy_working(model, 32, "none") == zero
    assert policy_memory.policy_working(model, 32, "offload") == zero  # its input on the host
    policy_memory.policy_working.cache_clear()
    monkeypatch.setattr(policy_memory, "_step_temp_elements", None)  # from the disk cache now
    assert policy_memory.policy_working(model, 32, "full") == full


def test_the_policy_working_set_is_what_the_whole_step_compiles_beyond_none():
    model = model_config("llama-tiny", n_layer=4)
    seq, batch = 128, 4
    w = policy_memory.policy_working(model, seq, "selective")
    # llama's softmax is recomputed inside the backward, beside the gradients: one score row
    assert w.scores == pytest.approx(1.0, abs=0.1) and w.other < 0.01 * model.n_embd
    excess = policy_memory._step_temp_elements(model, batch, seq, "selective")
    excess -= policy_memory._step_temp_elements(model, batch, seq, "none")
    kp, kn = layer_memory.kept(model, "selective"), layer_memory.kept(model, "none")
    kept = (kp.other - kn.other) + (kp.scores - kn.scores) * model.n_head * seq
    excess -= layer_memory.STACK * batch * seq * kept
    solved = batch * seq * (w.other + w.scores * model.n_head * seq) + w.fixed
    assert excess > 0 and solved == pytest.approx(excess, rel=0.05)


def test_the_policy_working_set_counts_xla_score_rows_alone(monkeypatch):
    rows = layer_memory.Working(other=0.0, scores=1.0, fixed=0.0)  # one recomputed row
    monkeypatch.setattr(policy_memory, "policy_working", lambda *_a: rows)
    xla = _plan(remat="full", data=4, seq=2, seq_mode="ulysses")
    ring = _plan(remat="full", data=4, seq=2, seq_mode="ring")
    piped = _plan(remat="full", data=4, pipe=2, pipeline="1f1b", microbatches=4)
    assert memory.working_parts(xla)["working_policy"] > 0
    # ring attention's backward recomputes its blocks under every policy; a pipeline's tick
    # body holds its chunk's residual sets, in whose place the recomputed values stand
    assert memory.working_parts(ring)["working_policy"] == 0.0
    assert memory.working_parts(piped)["working_policy"] == 0.0


def test_layer_figures_are_read_on_the_cpu_whatever_parallelism_is_in_force():
    # On a GPU host the default single-device layout sits on the GPU while the layer compiles'
    # arguments sit on the CPU (call 7 on the H200 stopped there). The same mismatch here: a
    # layout on another device than the arguments' CPU device 0.
    from jax.sharding import AxisType

    from colossal_jax.config import MESH_ORDER
    from colossal_jax.layers.context import single_device, use_parallelism
    from colossal_jax.tensor.layout import ActivationAxes
    from colossal_jax.tensor.replicated import ReplicatedLayout

    assert single_device("cpu").layout.mesh.devices.flat[0].platform == "cpu"
    n = len(MESH_ORDER)
    elsewhere = jax.make_mesh(
        (1,) * n, MESH_ORDER, axis_types=(AxisType.Auto,) * n, devices=jax.devices()[1:2]
    )
    layout = ReplicatedLayout(elsewhere, ActivationAxes(batch=("data",), seq="seq"))
    model = model_config("gpt2-tiny", **SMALL)
    with use_parallelism(layout):
        temps = layer_memory._temp_elements(model, 1, 16)
        kept = layer_memory._traced_kept(model, "none")
    assert temps > 0
    assert kept == layer_memory.kept(model, "none")


def test_layer_figures_compile_without_an_option_this_xla_does_not_know(monkeypatch):
    from colossal_jax.analysis import compile_only

    lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones(8))
    monkeypatch.setattr(compile_only, "LAYER_ANALYSIS", {"xla_no_such_option_here": 1})
    compiled = compile_only.compile_for_layer_figures(lowered)
    assert compiled.memory_analysis().output_size_in_bytes == 32


def test_ring_blocks_are_compiled_once_by_ring_length_then_read_from_disk(tmp_path, monkeypatch):
    # a 2-hop ring's loop holds more blocks at once than a 4-hop one's; 8 hops compile like 4
    monkeypatch.setenv("COLOSSAL_JAX_CACHE", str(tmp_path))
    assert [layer_memory.ring_hops(s) for s in (2, 4, 8)] == [2, 4, 4]
    model = model_config("gpt2-tiny", **{**SMALL, "n_embd": 96})
    layer_memory.ring_blocks.cache_clear()
    two, four = layer_memory.ring_blocks(model, 2), layer_memory.ring_blocks(model, 4)
    # scores, probabilities, their gradients and the hop's carried blocks inside the layer
    # stack: at least one hop's block, a handful at most
    assert 1 <= four < two < 12
    layer_memory.ring_blocks.cache_clear()

    def no_compile(*_a, **_k):
        raise AssertionError("compiled again instead of reading the cache")

    monkeypatch.setattr(layer_memory, "_ring_stack_temp", no_compile)
    assert layer_memory.ring_blocks(model, 2) == two
    assert layer_memory.ring_blocks(model, 8) == four


def test_the_working_set_holds_the_plans_own_ring_blocks(monkeypatch):
    asked: list[int] = []

    def blocks_of(count: float):
        def ring_blocks(model, seq):
            asked.append(seq)
            return count

        return ring_blocks

    for s in (2, 4, 8):  # the working set holds the plan's own ring's blocks, a·s/seq a token
        plan = _plan(data=8 // s, seq=s, seq_mode="ring")
        block = memory.act_bytes(plan) * memory.tokens_per_microbatch(plan) * 4 * 32 / s
        monkeypatch.setattr(layer_memory, "ring_blocks", blocks_of(3.0))
        three = memory.working_bytes(plan)
        monkeypatch.setattr(layer_memory, "ring_blocks", blocks_of(4.0))
        assert memory.working_bytes(plan) - three == pytest.approx(block)
        assert asked[-2:] == [s, s]


def test_grid_modes_hold_their_linears_gathered_inputs():
    flat = _plan(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d")
    model, t, q = flat.model, 4, 2
    gathered = (3 * model.n_embd + model.mlp_width) * (q - 1) / t
    assert memory._gathered_inputs(flat) == pytest.approx(gathered)
    one_d = _plan(data=2, tensor_row=4, tensor_mode="1d")
    assert memory._gathered_inputs(one_d) == 0.0
    depth_only = _plan(data=2, tensor_depth=4, tensor_mode="2.5d")  # q = 1: nothing gathered
    assert memory._gathered_inputs(depth_only) == 0.0


def test_a_pipelined_ring_tick_holds_one_score_block_per_layer_of_its_chunk():
    ring = _plan(data=2, pipe=2, seq=2, seq_mode="ring", pipeline="1f1b", microbatches=4)
    tokens = 16 // 2 // 4 * 32 // 2  # a microbatch's sequences on a shard × s/seq
    block = 4 * tokens * 4 * 32 // 2  # fp32 · tokens · heads · s/seq: one score block
    assert memory.memory_terms(ring)["pipe_ring"] == pytest.approx(block * 1)  # 1 layer a stage
    for plan in (
        _plan(data=4, seq=2, seq_mode="ring"),  # no pipeline
        _plan(data=2, pipe=2, seq=2, seq_mode="ulysses", pipeline="1f1b", microbatches=4),
    ):
        assert memory.memory_terms(plan)["pipe_ring"] == 0.0


def test_a_pipeline_holds_a_tick_chunk_gradient_and_its_schedule_gradient_slots():
    h = SMALL["n_embd"]
    for schedule, slots in (("gpipe", 4), ("1f1b", 1)):
        plan = _plan(
            data=2, pipe=2, tensor_row=2, tensor_mode="1d", pipeline=schedule, microbatches=4
        )
        assert build(schedule, 2, 4).slots["gradient"] == slots
        terms = memory.memory_terms(plan)
        tokens = 16 // 2 // 4 * 32  # a microbatch's sequences on a replica × s
        assert terms["pipe_grad_slots"] == pytest.approx(slots * 4 * tokens * h)  # 1D: whole
        # one stage's layers (no virtual stages), split over the tensor group, in fp32
        assert terms["pipe_chunk_grad"] == pytest.approx(4 * stack_params(plan.model) / 2 / 2)
    flat = memory.memory_terms(_plan(data=4, tensor_row=2, tensor_mode="1d"))
    assert flat["pipe_grad_slots"] == flat["pipe_chunk_grad"] == 0.0


def test_cpu_terms_price_attention_by_kernel_and_ticks_by_buffers_and_parameters():
    plain = cost.cpu_terms(_plan(data=8))
    scores = 16 * 4 * 32**2 * 2  # batch · heads · s² · layers
    kept = memory.kept_elements(_plan(data=8)) * 4 * 16 * 32 * 2  # fp32, batch·s, layers
    assert plain == pytest.approx(
        {
            "xla_score_s": scores,
            "ring_score_s": 0.0,
            "residual_tick_byte_s": 0.0,
            "stack_tick_byte_s": 0.0,
            "kept_byte_s": kept,
            "grid_flop_s": 0.0,
        }
    )
    ring = cost.cpu_terms(_plan(data=2, seq=4, seq_mode="ring"))
    assert ring["xla_score_s"] == 0.0 and ring["ring_score_s"] == scores
    # every tick costs the stage's record buffers: GPipe's M slots against 1F1B's p
    one_f = _plan(data=4, pipe=2, pipeline="1f1b", microbatches=4)
    gpipe = _plan(data=4, pipe=2, pipeline="gpipe", microbatches=4)
    for plan, slots in ((one_f, 2), (gpipe, 4)):
        ticks = build(plan.pipeline, 2, 4, 1).ticks
        want = ticks * slots * memory.chunk_bytes(plan) * plan.n_devices
        assert cost.cpu_terms(plan)["residual_tick_byte_s"] == pytest.approx(want)
        # and the stage's stacked parameters (its gradient sums, added into every tick), fp32
        stage = stack_params(plan.model) / 2
        want = ticks * stage * 4 * plan.n_devices
        assert cost.cpu_terms(plan)["stack_tick_byte_s"] == pytest.approx(want)
    # a tensor mode splits the stage's parameters; twice the microbatches, about twice the ticks
    split = _plan(data=2, pipe=2, tensor_row=2, tensor_mode="1d", pipeline="1f1b", microbatches=4)
    more = _plan(data=2, pipe=2, seq=2, seq_mode="ring", pipeline="1f1b", microbatches=8)
    base, halved, same = (
        cost.cpu_terms(p)["stack_tick_byte_s"] / build("1f1b", 2, p.schedule_microbatches, 1).ticks
        for p in (one_f, split, more)
    )
    assert halved == pytest.approx(base / 2) and same == pytest.approx(base)
    # interleaved: a tick adds into one chunk's rows of the stage's sums, the stage's over V
    kw = {"data": 4, "pipe": 2, "microbatches": 4, "layers": 4}
    fused = _plan(pipeline="1f1b", **kw)
    inter = _plan(pipeline="interleaved", virtual_stages=2, **kw)
    fused_tick, inter_tick = (
        cost.cpu_terms(p)["stack_tick_byte_s"] / pipeline_shape(p)[0] for p in (fused, inter)
    )
    assert inter_tick == pytest.approx(fused_tick / 2)
    gpu = _plan("gpu", data=8)
    assert cost.predict(gpu, hardware.hardware("h100")).cpu_s == 0.0
    cpu_hw = hardware.cpu_from(hardware.CPU_DEFAULT)
    assert cost.predict(_plan(data=8), cpu_hw).cpu_s > 0


def test_nnls_drops_a_negative_coefficient():
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 2, size=(20, 3))
    y = a @ np.array([2.0, 0.0, 3.0]) - 0.5 * a[:, 1]  # the free fit wants −0.5
    x = fit_cpu.nnls(a, y)
    assert (x >= 0).all() and x[1] == 0.0


def test_fit_recovers_the_figures_a_sweep_was_made_with():
    hw = hardware.cpu_from(hardware.CPU_DEFAULT)
    truth = {
        "collective_s": 1e-3,
        "xla_score_s": 2e-8,
        "ring_score_s": 1e-8,
        "residual_tick_byte_s": 2e-11,
        "stack_tick_byte_s": 1.5e-10,
        "kept_byte_s": 4e-10,
        "grid_flop_s": 2e-12,
    }
    layouts = [
        {"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d"},
        {"data": 4, "tensor_depth": 2, "tensor_mode": "2.5d"},
        {"data": 8},
        {"data": 2, "seq": 4, "seq_mode": "ring"},
        {"data": 2, "seq": 4, "seq_mode": "ulysses"},
        {"data": 4, "pipe": 2, "pipeline": "1f1b", "microbatches": 4},
        {"data": 4, "pipe": 2, "pipeline": "gpipe", "microbatches": 4},
        {
            "data": 2,
            "pipe": 2,
            "seq": 2,
            "seq_mode": "ulysses",
            "pipeline": "1f1b",
            "microbatches": 8,
        },
        {
            "data": 2,
            "pipe": 2,
            "tensor_row": 2,
            "tensor_mode": "1d",
            "pipeline": "1f1b",
            "microbatches": 4,
        },
        {"data": 4, "tensor_row": 2, "tensor_mode": "1d"},
        {"seq": 8, "seq_mode": "ring"},
    ]
    rows = []
    for par in layouts:
        plan = _plan(**par)
        priced, units = fit_cpu.features(plan, hw)
        seconds = priced + sum(truth[k] * units[k] for k in truth)
        rows.append(SimpleNamespace(seconds=seconds, ranked=SimpleNamespace(plan=plan)))
    got = fit_cpu.fit(rows, hw)
    assert got == pytest.approx(truth, rel=1e-6)


def test_the_whole_tensor_group_divides_the_logits():
    # the vocabulary split by the mode and, under a grid, the rows by the rest of the group:
    # llama-tiny's 2.5D plans at depth 2, 4 and 8 compile to the same peak as data=8
    plain = memory.memory_terms(_plan(data=8))["logits"]
    for par in (
        {"data": 4, "tensor_depth": 2, "tensor_mode": "2.5d"},
        {"data": 2, "tensor_depth": 4, "tensor_mode": "2.5d"},
        {"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d"},
        {"data": 4, "tensor_row": 2, "tensor_mode": "1d"},
    ):
        assert memory.memory_terms(_plan(**par))["logits"] == pytest.approx(plain)


def test_interleaved_holds_no_more_microbatches_than_there_are():
    """Interleaved 1F1B keeps ``p·(1 + (p−1)/(p·V))`` microbatches of a stage's activations in
    flight, but never more than the ``M`` that exist: with ``M = p = 2``, 2 (counting the
    ``M·V`` chunk-microbatches there gave 2.5, and 14 of the GPT's 18 interleaved M2/V2 plans
    were predicted 11–18% over their compiled memory; docs/planner.md)."""
    inter = {"pipe": 2, "pipeline": "interleaved", "virtual_stages": 2}
    few = _plan(data=4, microbatches=2, layers=4, **inter)
    many = _plan(data=4, microbatches=4, layers=4, **inter)
    assert memory._in_flight(few) == 2.0
    assert memory._in_flight(many) == pytest.approx(2 * (1 + 1 / 4))


def test_ring_self_attention_holds_more_rows_on_a_longer_ring_compiled_once(tmp_path, monkeypatch):
    """Ring self-attention computes one score block per hop and concatenates them into the rows
    (autodiff keeps the pieces): beyond XLA's attention it holds about ``p − 1`` rows more at
    small blocks, compiled at the plan's tokens per device and read from disk after."""
    monkeypatch.setenv("COLOSSAL_JAX_CACHE", str(tmp_path))
    model = model_config("gpt2-tiny", **SMALL)
    layer_memory.rsa_rows.cache_clear()
    two, four = layer_memory.rsa_rows(model, 32, 2), layer_memory.rsa_rows(model, 32, 4)
    assert 0.5 < two < four < 6
    layer_memory.rsa_rows.cache_clear()

    def no_compile(*_a, **_k):
        raise AssertionError("compiled again instead of reading the cache")

    monkeypatch.setattr(layer_memory, "_kernel_temp", no_compile)
    assert layer_memory.rsa_rows(model, 32, 4) == four
    # a ring longer than RSA_MAX_HOPS is scaled from the longest compiled
    monkeypatch.setattr(layer_memory, "RSA_MAX_HOPS", 4)
    layer_memory.rsa_rows.cache_clear()
    assert layer_memory.rsa_rows(model, 32, 8) == pytest.approx(2 * four)


def test_ring_self_attention_working_set_adds_its_rows_and_the_floor_leaves_them_out(monkeypatch):
    plan = _plan(data=2, seq=4, seq_mode="ring-self-attention")
    monkeypatch.setattr(layer_memory, "rsa_rows", lambda model, seq_len, seq: 0.0)
    base = memory.working_bytes(plan)
    monkeypatch.setattr(layer_memory, "rsa_rows", lambda model, seq_len, seq: 2.0)
    rows = 4 * memory.tokens_per_microbatch(plan) * 4 * 32  # fp32 · tokens · heads · s
    assert memory.working_bytes(plan) - base == pytest.approx(2 * rows)
    assert memory.working_bytes(plan, floor=True) == pytest.approx(base)
    ulysses = _plan(data=2, seq=4, seq_mode="ulysses")  # XLA's attention: nothing added
    assert memory.working_bytes(ulysses) == pytest.approx(base)


def test_a_split_backward_keeps_no_gathered_inputs_to_its_b():
    """A split F multiplies by the weights' stop_gradient, so a grid's gathered linear inputs,
    which only the weight gradients need, are not among its residuals (W gathers them again):
    the 2D ZB-H1 GPT at M = 2 and 4 compiled 14% under a record that held them."""
    grid = {"pipe": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d", "microbatches": 4}
    fused, split = _plan(pipeline="1f1b", **grid), _plan(pipeline="zb-h1", **grid)
    assert memory._record_elements(fused) == pytest.approx(memory.kept_elements(fused))
    without = memory.kept_elements(split) - memory._gathered_inputs(split)
    assert memory.kept_elements(split, gathered=False) == pytest.approx(without)
    assert memory._record_elements(split) < memory._record_elements(fused)


def test_the_recomputed_layer_counts_only_in_multi_layer_pipeline_chunks():
    from colossal_jax.auto.per_device import tokens_per_microbatch

    def plans(**par):
        return _plan(remat="dots", layers=4, **par), _plan(remat="none", layers=4, **par)

    flat = plans(data=8)
    one = plans(data=2, pipe=4, pipeline="1f1b", microbatches=4)
    inter = plans(data=4, pipe=2, pipeline="interleaved", microbatches=4, virtual_stages=2)
    two = plans(data=4, pipe=2, pipeline="1f1b", microbatches=4)
    for dots, plain in (flat, one, inter):  # the recomputed values take the stored ones' place
        assert not memory.recomputed_layer_counts(dots)
        policy = memory.working_parts(dots)["working_policy"]  # without a pipeline only
        assert dots is flat[0] or policy == 0.0
        assert memory.working_bytes(dots) - policy == pytest.approx(memory.working_bytes(plain))
    dots, plain = two  # a two-layer chunk holds them beside its record
    assert memory.recomputed_layer_counts(dots)
    layer = memory.kept_elements(dots, "none") - memory.kept_elements(dots)
    extra = memory.working_bytes(dots) - memory.working_bytes(plain)
    assert layer > 0 and extra == pytest.approx(4 * layer * tokens_per_microbatch(dots))


@pytest.mark.parametrize(
    "par,remat",
    [
        ({"data": 8}, "selective"),
        (
            {
                "data": 2,
                "pipe": 2,
                "tensor_row": 2,
                "tensor_mode": "1d",
                "pipeline": "1f1b",
                "microbatches": 8,
            },
            "selective",
        ),
        ({"tensor_row": 2, "tensor_col": 2, "tensor_depth": 2, "tensor_mode": "3d"}, "selective"),
        ({"data": 2, "tensor_row": 4, "tensor_mode": "1d"}, "dots"),
        (
            {
                "pipe": 4,
                "tensor_row": 2,
                "tensor_mode": "1d",
                "pipeline": "interleaved",
                "microbatches": 8,
                "virtual_stages": 2,
            },
            "full",
        ),
    ],
    ids=[
        "unpipelined",
        "two-stage-1d",
        "3d-partial-products",
        "1d-whole-outputs",
        "1d-one-layer-chunks-full",
    ],
)
def test_remat_memory_is_within_10_percent_of_the_compiled_peak(par, remat):
    """Shapes the recomputed layer's rule was not fitted on (8 layers; the fit: 4): 8 CPU
    devices, the 256-wide GPT at batch 16 × seq 256 (until 2026-11-28 the first was 16% over)."""
    from colossal_jax.auto import measure

    plan = _plan(remat=remat, model={"n_layer": 8, "n_embd": 256}, seq_len=256, **par)
    compiled = measure.compile_plan(plan).peak_bytes
    assert memory.memory_bytes(plan) == pytest.approx(compiled, rel=0.10)


def test_a_1d_one_layer_chunk_under_full_remat_holds_its_recomputed_whole_values():
    """``pipe_recomputed_1d_whole``: ``none``'s kept values times its whole share, for one
    microbatch, in a 1D pipeline of one-layer chunks under ``full`` alone (the compiled check:
    the ``1d-one-layer-chunks-full`` case above, 10.8% under without it)."""
    from colossal_jax.auto.per_device import tokens_per_microbatch

    one = {"pipe": 4, "tensor_row": 2, "tensor_mode": "1d", "pipeline": "gpipe"}
    plan = _plan(remat="full", layers=4, microbatches=8, **one)
    k = layer_memory.kept(plan.model, "none")
    whole = k.other * memory._whole_share(plan, "none") * tokens_per_microbatch(plan) * 4
    assert whole > 0
    assert memory.memory_terms(plan)["pipe_recomputed_1d_whole"] == pytest.approx(whole)
    others = [
        _plan(remat="dots", layers=4, microbatches=8, **one),  # the policy keeps its outputs
        _plan(remat="full", layers=8, microbatches=8, **one),  # two-layer chunks: the layer
        _plan(remat="full", layers=4, data=2, pipe=4, pipeline="gpipe", microbatches=8),
        _plan(remat="full", layers=4, data=4, tensor_row=2, tensor_mode="1d"),
    ]
    for other in others:
        assert memory.memory_terms(other)["pipe_recomputed_1d_whole"] == 0.0


def test_grid_modes_flops_are_priced_apart_on_the_cpu():
    """``grid_flop_s``: every FLOP a 2D, 2.5D or 3D plan runs, over the devices; none for 1D,
    a sequence split or data parallelism alone."""
    grid = _plan(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d")
    assert cost.cpu_terms(grid)["grid_flop_s"] == pytest.approx(cost.flops(grid)[1] * 8)
    for par in ({"data": 8}, {"data": 4, "tensor_row": 2, "tensor_mode": "1d"}):
        assert cost.cpu_terms(_plan(**par))["grid_flop_s"] == 0.0


def test_3d_keeps_its_partial_products_under_the_policies_that_keep_matmul_outputs():
    cube = {"tensor_row": 2, "tensor_col": 2, "tensor_depth": 2, "tensor_mode": "3d"}
    for remat in memory.DOT_KEEPING:
        plan = _plan(remat=remat, **cube)
        k = layer_memory.kept(plan.model, remat)
        split = memory._split_elements(plan, k.other, k.scores, h_share=0.0)
        assert memory.kept_elements(plan) == pytest.approx(split + k.other / 8)  # q = 2 times
    plain = _plan(**cube)  # under none the traced residuals as they are
    k = layer_memory.kept(plain.model, "none")
    want = memory._split_elements(plain, k.other, k.scores, h_share=0.0)
    assert memory.kept_elements(plain, gathered=False) == pytest.approx(want)


def test_1d_whole_outputs_count_apart_only_with_a_fused_backward():
    oned = {"data": 2, "pipe": 2, "tensor_row": 2, "tensor_mode": "1d", "microbatches": 4}
    fused = _plan(remat="selective", pipeline="1f1b", **oned)
    split = _plan(remat="selective", pipeline="zb-h1", **oned)
    assert memory.whole_1d_bytes(fused) > 0 and memory.whole_1d_bytes(split) == 0.0
    assert memory.whole_1d_bytes(_plan(remat="selective", data=8)) == 0.0
    # none's traced share is exact: the term carries no weight there
    assert memory_weights.weight("kept_1d_whole", "none") == 0.0
    assert memory_weights.weight("kept_1d_whole", "selective") > 0


def test_1d_whole_share_is_traced_per_device_for_each_family_and_policy(monkeypatch):
    """The share 1D leaves whole, from the layer's residuals traced per device: the GPT keeps
    its layer input and output projection whole under ``selective`` (2 of 9 ``h``-wide units),
    BERT's post-LayerNorm block its MLP output as well (3 of 10); ``full`` keeps the layer
    input alone. The share read at a 2-way split gives the 4-way split's kept values too."""
    gpt = model_config("gpt2-tiny", **SMALL)
    bert = model_config("bert-tiny", **SMALL)
    assert whole_share.whole_share(gpt, "selective") == pytest.approx(2 / 9)
    assert whole_share.whole_share(bert, "selective") == pytest.approx(3 / 10)
    assert whole_share.whole_share(bert, "full") == pytest.approx(1.0)
    w, one = whole_share.whole_share(bert, "dots"), layer_memory.kept(bert, "dots").other
    monkeypatch.setattr(whole_share, "SPLIT", 4)
    assert whole_share._split_other(bert, "dots") == pytest.approx(one * (w + (1 - w) / 4))


def test_1d_whole_share_is_traced_once_then_read_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("COLOSSAL_JAX_CACHE", str(tmp_path))
    model = model_config("bert-tiny", **{**SMALL, "n_embd": 96})  # a size nothing else uses
    whole_share.whole_share.cache_clear()
    first = whole_share.whole_share(model, "selective")
    whole_share.whole_share.cache_clear()

    def no_trace(*_a, **_k):
        raise AssertionError("traced again instead of reading the cache")

    monkeypatch.setattr(whole_share, "_split_other", no_trace)
    assert whole_share.whole_share(model, "selective") == first
    whole_share.whole_share.cache_clear()


def test_1d_plans_keep_the_traced_whole_share():
    """A 1D plan's kept values per token: the whole share on every device, the rest split."""
    plan = _plan(remat="selective", data=2, tensor_row=4, tensor_mode="1d")
    k, w = (
        layer_memory.kept(plan.model, "selective"),
        whole_share.whole_share(plan.model, "selective"),
    )
    assert memory.kept_elements(plan) == pytest.approx(k.other * (w + (1 - w) / 4))


def test_remat_policies_weigh_the_memory_terms_by_their_own_weights():
    for remat in ("none", "dots", "selective", "full"):
        plan = _plan(remat=remat, data=2, pipe=2, seq=2, seq_mode="ring", pipeline="1f1b",
                     microbatches=4, layers=4)  # fmt: skip
        terms = memory.memory_terms(plan)
        want = sum(memory_weights.weight(k, remat) * v for k, v in terms.items())
        assert memory.memory_bytes(plan) == pytest.approx(want)
        assert cost.predict(plan, hardware.hardware("cpu")).memory_bytes == pytest.approx(want)
        # the floor stays a lower bound under every policy's weights
        assert memory.memory_bytes(plan, floor=True) <= memory.memory_bytes(plan)
        if remat in memory_weights.REMAT_COEF:  # its own weights give another peak than none's
            assert abs(want / memory_weights.weighted(terms, "none") - 1) > 0.01
    assert memory_weights.weight("working", "full") == memory_weights.MEMORY_COEF["working"]


def test_zero_gradient_terms_follow_the_compiled_step():
    # ZeRO-2 reduce-scatters the gradient after the backward, so at the peak it is ZeRO-1's
    # whole gradient; ZeRO-3 shards it inside the backward and, under every remat policy,
    # keeps no gathered layer for it (docs/planner_log.md, 2026-12-04 and 2026-12-05)
    def grads(zero: int, remat: str = "none", **par) -> float:
        return memory.memory_terms(_plan(remat=remat, data=8, zero=zero, **par))["grads"]

    assert grads(2) == grads(1) == grads(0)
    assert grads(3) == grads(3, "dots") == pytest.approx(grads(0) / 8)
    # with accumulation the accumulator beside it: whole below ZeRO-2, a shard from it
    base = _plan(data=8, zero=2)
    acc = resolve(dataclasses.replace(base.config, grad_accum=2), base.devices)
    assert memory.memory_terms(acc)["grads"] == pytest.approx(grads(0) * (1 + 1 / 8))


def test_grid_modes_hold_their_weights_gathered_along_one_side(monkeypatch):
    """SUMMA-style 2D gathers a layer's weight to ``q`` times its block (``q = 2`` on a 2×2
    grid): one more block of the one-device weight gradient, in fp32; 1D and no split hold the
    block alone."""
    grid = _plan(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d")
    w = layer_memory.working(grid.model, grid.config.seq_len)
    gathered = memory.working_parts(grid)["working"]
    assert memory._gathered_weights(grid) == 2.0
    monkeypatch.setattr(memory, "_gathered_weights", lambda plan: 1.0)
    assert gathered - memory.working_parts(grid)["working"] == pytest.approx(4 * w.fixed / 4)
    monkeypatch.undo()
    assert memory._gathered_weights(_plan(data=2, tensor_row=4, tensor_mode="1d")) == 1.0
    assert memory._gathered_weights(_plan(data=8)) == 1.0
