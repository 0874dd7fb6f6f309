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


# --- tests that time a command run alone --------------------------------------------------------
# A test marked ``quiet`` asserts a wall-clock limit on a command (the impossible plan request in
# under 20 s, a clear error in under 20 s). Under pytest-xdist the other worker's tests load the
# same two cores beside it (2026-12-04: the impossible request took 33.5 s in the suite, 16 s
# alone), so the limit would measure the suite, not the command. Every test holds a shared lock
# for its setup, call and teardown; a quiet test holds it exclusively, and a gate taken first
# makes the other worker wait rather than slip in ahead of it.

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@contextlib.contextmanager
def _held(path: Path, mode: int):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing runs beside the test
        yield
        return
    base = Path(tempfile.gettempdir()) / f"colossal-jax-tests-{run}"
    gate, suite = base.with_suffix(".gate"), base.with_suffix(".lock")
    if item.get_closest_marker("quiet") is not None:
        with _held(gate, fcntl.LOCK_EX), _held(suite, fcntl.LOCK_EX):
            yield
        return
    with _held(gate, fcntl.LOCK_EX):
        shared = _held(suite, fcntl.LOCK_SH)
        shared.__enter__()
    try:
        yield
    finally:
        shared.__exit__(None, None, None)


def pytest_configure(config):
    """The controller names the run (xdist's ``--testrunuid``, which its workers see as
    ``PYTEST_XDIST_TESTRUNUID``) so that it can remove the run's lock files at the end."""
    if hasattr(config, "workerinput") or not hasattr(config.option, "testrunuid"):
        return
    if config.option.testrunuid is None:
        import uuid

        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session, exitstatus):
    """The controller removes the run's lock files once every worker has ended."""
    run = getattr(session.config.option, "testrunuid", None)
    if run is None or hasattr(session.config, "workerinput"):
        return
    for suffix in (".gate", ".lock"):
        (Path(tempfile.gettempdir()) / f"colossal-jax-tests-{run}{suffix}").unlink(missing_ok=True)
