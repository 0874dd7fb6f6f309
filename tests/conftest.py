"""Simulate 8 host devices before JAX is imported, run in full fp32 precision, and share one
persistent XLA compilation cache among the test workers and the runs they start.

Many tests compile the same programs (the default tiny run, in-process and in the subprocesses
of the signal, fault, resume and launch tests): with the cache a repeated compile loads
(``scripts/train.py --steps 3`` on 8 simulated devices: 7.8 s cold, 4.0 s warm). The cache is
keyed by the program, JAX's version and the flags, so a cached executable is the one a compile
would give; ``COLOSSAL_JAX_TEST_XLA_CACHE=off`` runs every compile cold, a path puts the cache
there (default: ``colossal-jax-test-xla-cache-USER`` in the temporary directory). Two processes
may meet at one entry while it is written: JAX then warns that it could not read it and
compiles.
"""

import getpass
import os
import tempfile
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_cache = os.environ.get("COLOSSAL_JAX_TEST_XLA_CACHE", "")
if _cache != "off":
    try:
        _user = getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without a passwd entry)
        _user = str(os.getuid())
    _default = Path(tempfile.gettempdir()) / f"colossal-jax-test-xla-cache-{_user}"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache or str(_default))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
