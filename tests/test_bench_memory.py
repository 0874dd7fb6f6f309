"""scripts/bench_memory.py's measurement: per-device parameter, gradient and optimizer bytes read
from compiled memory analysis match docs/formulas.md section 4 for every ZeRO stage."""

import pytest

from colossal_jax_benchmarks import memorybench as mb

# n_embd=100: the attention kernels (100×100 per layer), the norms and some biases have no
# dimension that divides by 8, so ZeRO leaves them replicated and the formula counts them whole.
TINY = mb.Model(n_layer=2, n_embd=100, batch=8, seq=64)


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_state_bytes_match_the_zero_formula(zero):
    r = mb.measure(TINY, zero, remat="full", devices=8)
    assert r["leftovers"], "the tiny model should have replicated leftovers"
    state = r["param_bytes"] + r["grad_bytes"] + r["opt_bytes"]
    assert state == pytest.approx(r["formula_bytes"], rel=0.05)
    assert r["param_bytes"] == pytest.approx(r["formula_param_bytes"], rel=0.05)
    assert r["grad_bytes"] == pytest.approx(r["formula_grad_bytes"], rel=0.05)
    assert r["opt_bytes"] == pytest.approx(r["formula_opt_bytes"], rel=0.05)
    if zero == 3:  # the leftovers matter: 16Ψ/N_d alone undercounts by far
        assert state > 1.5 * 16 * r["n_params"] / 8
