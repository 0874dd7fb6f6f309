"""Simulate 8 host devices before JAX is imported, run in full fp32 precision, and compile with
XLA's CPU backend optimisation at level 0.

The tests' programs are tiny: compiling them costs far more than running them, and LLVM's
optimisation of the generated CPU code is most of a compile. Level 0 (also in the environment of
the scripts the tests start: the tests pass it on, and ``scripts/crashlib.py``'s ``env`` keeps
it for the runs the loop scripts start) cut the ring and pipeline-composition tests from 118.5 s
to 89.1 s; every comparison in the suite is between programs compiled alike. No persistent
compilation cache: on the CPU backend a ring-attention step loaded from one deadlocks (see
``colossal_jax.runtime.compile_cache``).
"""

import os

from tests.helpers import LEVEL0  # JAX-free: nothing has imported JAX yet

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count=8 {LEVEL0}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
