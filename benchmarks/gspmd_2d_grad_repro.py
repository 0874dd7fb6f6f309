"""Reproducer: XLA's CPU SPMD partitioner (jax/jaxlib 0.10.2) returns a wrong weight gradient
for a 2D-sharded MLP when the batch is split over an axis that also splits the weights.

``y = h + tanh(h @ w1) @ w2`` with ``w1, w2`` sharded ``P("row", "col")`` on a mesh
``data=2, row=2, col=2``. With the activations' batch over ``("data", "row")`` the gradient of
``w1`` is off by ~80% of its largest element; with the batch over ``data`` alone it matches the
single-device gradient. The loss itself is right in both. This is why the plain-GSPMD 2D baseline
(``benchmarks/plain_jax_gpt.py``) splits the batch over ``data`` only.

Run: ``python benchmarks/gspmd_2d_grad_repro.py`` (8 simulated CPU devices; exits 1 while the
bug is present).
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def main() -> int:
    jax.config.update("jax_default_matmul_precision", "highest")
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("data", "row", "col"))
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (8, 32, 64))
    w1 = jax.random.normal(k[1], (64, 256)) * 0.1
    w2 = jax.random.normal(k[2], (256, 64)) * 0.1

    def f(w1, w2, x, spec):
        con = (
            (lambda a: a)
            if spec is None
            else (lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec)))
        )
        h = con(x)
        return jnp.sum(con(h + jnp.tanh(h @ w1) @ w2) ** 2)

    ref = jax.grad(f, argnums=(0, 1))(w1, w2, x, None)
    ws = NamedSharding(mesh, P("row", "col"))
    bad = False
    for spec in (P(("data", "row"), None, "col"), P("data", None, "col")):
        args = (
            jax.device_put(w1, ws),
            jax.device_put(w2, ws),
            jax.device_put(x, NamedSharding(mesh, spec)),
        )
        g = jax.jit(jax.grad(f, argnums=(0, 1)), static_argnums=3)(*args, spec)
        err = [
            float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
            for a, b in zip(g, ref, strict=True)
        ]
        print(f"activations {spec}: relative error of dw1 {err[0]:.2e}, dw2 {err[1]:.2e}")
        bad |= max(err) > 1e-4
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
